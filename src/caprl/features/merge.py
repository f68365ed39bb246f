"""``caprl merge-features``: join feature shards into one HDF5 file, rows sorted by image id.

The shards must come from the same backbone and settings (equal attrs), hold no image twice,
and, when they say which shard of how many they are, be the complete set. With
``--annotations`` the merged ids must equal the annotations' ids exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from caprl.errors import CaprlError
from caprl.data.feature_store import FeatureWriter, check_file, open_features_file
from caprl.io import atomic_hdf5

log = logging.getLogger(__name__)

SHARD_ATTRS = ("shard", "n_shards")
BLOCK_ROWS = 512


def _ids_list(ids: np.ndarray, limit: int = 10) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:limit])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def _check_shard_set(paths: Sequence[Path], attrs: Sequence[dict[str, Any]]) -> None:
    """When the shards carry ``shard``/``n_shards``, they must be shards 0..n-1, once each."""
    if not all("shard" in a and "n_shards" in a for a in attrs):
        return
    counts = {int(a["n_shards"]) for a in attrs}
    if len(counts) > 1:
        raise CaprlError(f"shards were cut {sorted(counts)} ways: {', '.join(map(str, paths))}; delete stale "
                         "shard files and re-extract the shards with one params.yaml")
    n = counts.pop()
    seen: dict[int, Path] = {}
    for path, a in zip(paths, attrs):
        if int(a["shard"]) in seen:
            raise CaprlError(f"{path} and {seen[int(a['shard'])]} are both shard {a['shard']}; pass each shard once")
        seen[int(a["shard"])] = path
    absent = sorted(set(range(n)) - set(seen))
    if absent:
        raise CaprlError(f"shard(s) {absent} of {n} missing from --shards; run caprl features --shard for them")


def merge_shards(
    shard_paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    annotation_ids: Sequence[int] | None = None,
    source: str = "the annotations",
) -> int:
    """Merge shard files into ``out`` (atomically), rows ordered by image id ascending.

    Checks that the shards agree on backbone and settings, contain no duplicate ids and,
    if ``annotation_ids`` is given, cover exactly those ids. Returns the number of rows.
    """
    paths = [Path(p) for p in shard_paths]
    if not paths:
        raise CaprlError("no shard files given (--shards)")
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_features_file(p)) for p in paths]
        attrs = [check_file(h5, p) for h5, p in zip(files, paths)]
        common = {k: v for k, v in attrs[0].items() if k not in SHARD_ATTRS}
        for path, a in zip(paths[1:], attrs[1:]):
            other = {k: v for k, v in a.items() if k not in SHARD_ATTRS}
            if other != common:
                diff = sorted(k for k in set(common) | set(other) if common.get(k) != other.get(k))
                raise CaprlError(f"{path} differs from {paths[0]} in {', '.join(diff)}; re-extract all shards with "
                                 "the same params.yaml")
        _check_shard_set(paths, attrs)

        ids_per_shard = [h5["image_ids"][:] for h5 in files]
        all_ids = np.concatenate(ids_per_shard).astype(np.int64)
        shard_of = np.concatenate([np.full(len(ids), s) for s, ids in enumerate(ids_per_shard)])
        row_of = np.concatenate([np.arange(len(ids)) for ids in ids_per_shard])
        order = np.argsort(all_ids, kind="stable")
        sorted_ids = all_ids[order]
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if len(dup):
            i = dup[0]
            a, b = paths[shard_of[order[i]]], paths[shard_of[order[i + 1]]]
            raise CaprlError(f"image id {int(sorted_ids[i])} is in {a} and in {b} ({len(dup)} duplicate rows in all); "
                             "pass each shard once, and shards cut from one annotations file")
        if annotation_ids is not None:
            want = np.unique(np.asarray(annotation_ids, dtype=np.int64))
            missing = np.setdiff1d(want, sorted_ids)
            extra = np.setdiff1d(sorted_ids, want)
            if len(missing):
                raise CaprlError(f"the shards lack features for image id(s) {_ids_list(missing)} of {source}; "
                                 "re-run caprl features for every shard of this annotations file")
            if len(extra):
                raise CaprlError(f"the shards hold image id(s) {_ids_list(extra)} not in {source}; they were "
                                 "extracted from other annotations: re-run caprl features")

        n, dim, n_regions = len(sorted_ids), int(common["dim"]), int(common["n_regions"])
        with atomic_hdf5(out) as h5:  # a failed write: a WriteError, the old file kept, HDF5 closed safely
            h5.attrs.update(common)  # the layout of caprl.data.feature_store.open_writer
            writer = FeatureWriter(h5, n, dim, n_regions)
            for start in tqdm(range(0, n, BLOCK_ROWS), desc="merge features", unit="block", mininterval=5.0, disable=None):
                block = order[start:start + BLOCK_ROWS]
                pooled = np.empty((len(block), dim), np.float32)
                regions = np.empty((len(block), n_regions, dim), np.float32)
                for s in np.unique(shard_of[block]):
                    where = np.flatnonzero(shard_of[block] == s)
                    rows = row_of[block[where]]
                    uniq, inverse = np.unique(rows, return_inverse=True)
                    pooled[where] = files[s]["pooled"][uniq][inverse]
                    regions[where] = files[s]["regions"][uniq][inverse]
                writer.write(all_ids[block], pooled, regions)
            if writer.rows_written != n:
                raise RuntimeError(f"{out}: wrote {writer.rows_written} of {n} rows")
    log.info("merged %d shard(s), %d images -> %s", len(paths), n, out)
    return n


def shards_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The shard files in ``folder``: every ``*.h5`` directly in it (temporary files are hidden)."""
    d = Path(folder)
    if not d.is_dir():
        raise CaprlError(f"--shard-dir {d}: no such folder; run caprl features for every shard first")
    paths = sorted(p for p in d.glob("*.h5") if not p.name.startswith("."))
    if not paths:
        raise CaprlError(f"--shard-dir {d}: no .h5 shard files in it; run caprl features for every shard first")
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--shards", nargs="+", help="shard HDF5 files (from caprl features)")
    which.add_argument("--shard-dir", help="folder whose *.h5 files are the shards (stale files there are errors)")
    parser.add_argument("--out", required=True, help="merged HDF5 file")
    parser.add_argument("--annotations", default=None,
                        help="normalised annotations JSON: check the shards cover exactly its images")


def main(args: argparse.Namespace) -> None:
    annotation_ids = None
    if args.annotations:
        from caprl.data.annotations import load_annotations

        annotation_ids = [int(im["id"]) for im in load_annotations(args.annotations)["images"]]
    paths = args.shards if args.shards else shards_in(args.shard_dir)
    merge_shards(paths, args.out, annotation_ids, source=str(args.annotations))
