"""Bottom-up-attention features (Anderson et al. 2018) -> this project's features HDF5 file.

Input: the TSV files of peteanderson80/bottom-up-attention (``trainval_36``: 36 Faster R-CNN
boxes per COCO image), read as its ``tools/read_tsv.py`` does: tab-separated fields
:data:`FIELDNAMES` without a header (``csv.field_size_limit`` raised, a row is ~400 KB), where
``boxes`` and ``features`` are base64 of float32 arrays of shape (num_boxes, 4) (x1, y1, x2, y2
in pixels) and (num_boxes, 2048). ``image_id`` is the COCO id, the id of the annotations.

Output (``caprl bottomup --tsv F [F ...] --out features.h5``): the layout of
:func:`caprl.data.feature_store.open_writer` -- ``regions`` are the boxes' features (the attention
features, R = num_boxes), ``pooled`` their mean (the fc feature), rows sorted by image id,
attrs ``backbone = "bottomup"`` and ``grid = 0`` (the regions are boxes, not a grid) -- plus::

    boxes       float32 [N, R, 4]   each region's box, x1 y1 x2 y2 in pixels
    image_size  int32   [N, 2]      image_w, image_h

Every row must have the same number of boxes. A bad row is a CaprlError naming the file, the
line and what is wrong.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import json
import logging
import os
import sys
from pathlib import Path
from typing import BinaryIO, Collection, Iterator, NamedTuple, Sequence

import numpy as np
from tqdm import tqdm

from caprl.errors import CaprlError
from caprl.data.feature_store import FeatureWriter, chunk_rows
from caprl.io import atomic_hdf5

log = logging.getLogger(__name__)

FIELDNAMES = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
FEATURE_DIM = 2048
BLOCK_ROWS = 64


class BottomUpRow(NamedTuple):
    image_id: int
    image_w: int
    image_h: int
    boxes: np.ndarray  # float32 [num_boxes, 4]
    features: np.ndarray  # float32 [num_boxes, dim]


def _raise_field_limit() -> None:
    limit = sys.maxsize
    while True:  # sys.maxsize overflows a C long on some platforms
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:
            limit //= 2


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset, line)`` of every non-blank line of ``path``."""
    offset = 0
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                yield n, offset, line
            offset += len(line)


def _fields(line: bytes, where: str) -> list[str]:
    try:
        fields = next(csv.reader([line.decode("ascii")], delimiter="\t"))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CaprlError(f"{where}: not a bottom-up feature row ({exc})") from None
    if len(fields) != len(FIELDNAMES):
        raise CaprlError(f"{where}: {len(fields)} tab-separated fields, expected {len(FIELDNAMES)} "
                         f"({', '.join(FIELDNAMES)})")
    return fields


def _header(fields: list[str], where: str) -> tuple[int, int, int, int]:
    """``image_id, image_w, image_h, num_boxes`` of a row, checked."""
    values = []
    for name, text in zip(FIELDNAMES[:4], fields[:4]):
        try:
            values.append(int(text))
        except ValueError:
            raise CaprlError(f"{where}: {name} is {text[:40]!r}, not an integer") from None
    if values[3] < 1:
        raise CaprlError(f"{where}: num_boxes is {values[3]}, expected at least 1")
    return values[0], values[1], values[2], values[3]


def _array(text: str, name: str, num_boxes: int, dim: int, where: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CaprlError(f"{where}: {name} is not valid base64 ({exc})") from None
    want = num_boxes * dim * 4
    if len(raw) != want:
        raise CaprlError(f"{where}: {name} decodes to {len(raw)} bytes, expected num_boxes x {dim} float32 = "
                         f"{num_boxes} x {dim} x 4 = {want}")
    array = np.frombuffer(raw, dtype="<f4").reshape(num_boxes, dim).astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise CaprlError(f"{where}: {name} holds NaN or infinite values")
    return array


def parse_row(line: bytes, where: str, dim: int = FEATURE_DIM) -> BottomUpRow:
    """One TSV line -> a :class:`BottomUpRow`; ``where`` (``file:line``) names it in errors."""
    fields = _fields(line, where)
    image_id, w, h, num_boxes = _header(fields, where)
    return BottomUpRow(image_id, w, h, _array(fields[4], "boxes", num_boxes, 4, where),
                       _array(fields[5], "features", num_boxes, dim, where))


def iter_rows(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
              dim: int = FEATURE_DIM) -> Iterator[BottomUpRow]:
    """The rows of one or several bottom-up TSV files, in file order, each checked."""
    _raise_field_limit()
    for path in [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]:
        for n, _offset, line in _lines(_existing(path)):
            yield parse_row(line, f"{path}:{n}", dim)


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise CaprlError(f"bottom-up feature file not found: {path}")
    return path


def _index(paths: Sequence[Path]) -> tuple[dict[int, tuple[int, int, int]], int]:
    """Pass 1: ``{image_id: (file index, line number, byte offset)}`` and the common box count."""
    index: dict[int, tuple[int, int, int]] = {}
    n_boxes = 0
    for k, path in enumerate(paths):
        for n, offset, line in _lines(_existing(path)):
            where = f"{path}:{n}"
            image_id, _w, _h, num_boxes = _header(_fields(line, where), where)
            if image_id in index:
                f, m, _ = index[image_id]
                raise CaprlError(f"{where}: image_id {image_id} again (first at {paths[f]}:{m}); pass each "
                                 "file once")
            n_boxes = n_boxes or num_boxes
            if num_boxes != n_boxes:
                raise CaprlError(f"{where}: {num_boxes} boxes, but earlier rows have {n_boxes}; the features "
                                 "file needs the same number for every image (use the fixed 36-box files)")
            index[image_id] = (k, n, offset)
    if not index:
        raise CaprlError(f"no rows in {', '.join(map(str, paths))}")
    return index, n_boxes


def convert(tsv_paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, dim: int = FEATURE_DIM,
            image_ids: Collection[int] | None = None, dataset: str | None = None,
            annotations_sha: str | None = None) -> int:
    """Write the rows of ``tsv_paths`` as a features file at ``out`` (atomically; layout above).

    ``image_ids``: keep only these images (rows of others are dropped), and every one of them
    must be in the files; ``dataset`` and ``annotations_sha`` (the annotations' fingerprint) are
    recorded for the provenance check of the stages that read the file. Returns the rows written.
    """
    _raise_field_limit()
    paths = [Path(p) for p in tsv_paths]
    index, n_boxes = _index(paths)
    ids = sorted(index)
    if image_ids is not None:
        want = {int(i) for i in image_ids}
        if not want:
            raise CaprlError("no image ids to keep (the annotations list no images)")
        missing = sorted(want - index.keys())
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise CaprlError(f"no bottom-up features for image id(s) {shown} in {', '.join(map(str, paths))}")
        log.info("%d of %d rows kept (the annotations' images)", len(want), len(ids))
        ids = sorted(want)
    attrs = {"backbone": "bottomup", "grid": 0, "dim": dim, "n_regions": n_boxes,
             "backbone_config": json.dumps({"source": "bottom-up-attention TSV (Anderson et al. 2018)",
                                            "files": [p.name for p in paths], "boxes": n_boxes}, sort_keys=True),
             **({"dataset": dataset} if dataset else {}),
             **({"annotations_sha": annotations_sha} if annotations_sha else {})}
    with atomic_hdf5(out) as h5:
        for key, value in attrs.items():
            h5.attrs[key] = value
        writer = FeatureWriter(h5, len(ids), dim, n_boxes)
        boxes_ds = h5.create_dataset("boxes", shape=(len(ids), n_boxes, 4), dtype="float32", track_times=False,
                                     chunks=(chunk_rows(len(ids), 16 * n_boxes), n_boxes, 4))
        size_ds = h5.create_dataset("image_size", shape=(len(ids), 2), dtype="int32", track_times=False)
        handles = [open(p, "rb") for p in paths]
        try:
            for start in tqdm(range(0, len(ids), BLOCK_ROWS), desc="bottom-up features", unit="block",
                              mininterval=5.0, disable=None):
                block = [_read(handles, paths, index[i], dim) for i in ids[start:start + BLOCK_ROWS]]
                regions = np.stack([r.features for r in block])
                writer.write([r.image_id for r in block], regions.mean(axis=1), regions)
                boxes_ds[start:start + len(block)] = np.stack([r.boxes for r in block])
                size_ds[start:start + len(block)] = [(r.image_w, r.image_h) for r in block]
        finally:
            for fh in handles:
                fh.close()
    log.info("%d images x %d boxes x %d -> %s", len(ids), n_boxes, dim, out)
    return len(ids)


def _read(handles: list[BinaryIO], paths: Sequence[Path], at: tuple[int, int, int], dim: int) -> BottomUpRow:
    k, n, offset = at
    handles[k].seek(offset)
    return parse_row(handles[k].readline(), f"{paths[k]}:{n}", dim)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tsv", nargs="+", required=True, help="bottom-up TSV file(s), e.g. the trainval_36 ones")
    parser.add_argument("--out", required=True, help="features HDF5 file to write")
    parser.add_argument("--dim", type=int, default=FEATURE_DIM, help="feature size of a box (default 2048)")
    parser.add_argument("--annotations", default=None,
                        help="normalised annotations JSON: keep only its images, and require all of them")
    parser.add_argument("--dataset", default=None, help="dataset name stored in the file's attrs")


def main(args: argparse.Namespace) -> None:
    image_ids, fingerprint = None, None
    if args.annotations:
        from caprl.io import provenance
        from caprl.data.annotations import load_annotations

        annotations = load_annotations(args.annotations)
        image_ids = [int(im["id"]) for im in annotations["images"]]
        fingerprint = provenance.fingerprint(annotations)
    convert(args.tsv, args.out, dim=args.dim, image_ids=image_ids, dataset=args.dataset, annotations_sha=fingerprint)
