"""``caprl prepare --dataset NAME``: a dataset's raw files -> normalised annotations.

The dataset's ``format`` picks the reader (:mod:`caprl.data.readers`: ``karpathy``,
:mod:`caprl.data.karpathy`, for COCO, Flickr30k and the synthetic set; ``tgif``,
:mod:`caprl.data.tgif`). Every reader writes the same annotations, sorted by id::

    {"dataset": <the dataset's name under datasets:>,
     "images": [{"id": int, "file": "<path relative to image_root>", "split": "train"|"val"|"test",
                 "captions": [[token, ...], ...], "raw": [sentence, ...]}, ...],
     "stats": {...counts of what was read, remapped and dropped...}}

This stage checks that the splits the workflow reads have images and writes the file.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from caprl import io, params as params_mod
from caprl.data import SPLITS
from caprl.data.readers import build_reader
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SPLIT_SOURCE = {"karpathy": "set \"split\": \"{split}\" on some of its images; Karpathy's 'restval' counts as train",
                "tgif": "list some GIFs in {split}.txt beside it, one URL per line"}


def needed_splits(params: dict[str, Any], dataset: str) -> dict[str, list[tuple[str, str]]]:
    """The splits the workflow reads of ``dataset``: split -> [(why, how else to avoid it)].
    Train always, val when a run trains on it, and ``evaluate.split``."""
    needed: dict[str, list[tuple[str, str]]] = {
        "train": [("the vocabulary, the CIDEr-D document frequencies and training read it", "")]}
    if params["datasets"][dataset].get("runs", params["runs"]):
        needed["val"] = [("training picks each run's best epoch on validation CIDEr-D",
                          f"set datasets.{dataset}.runs: [] if nothing is to be trained on it")]
    needed.setdefault(params["evaluate"]["split"], []).append(
        ("evaluation scores it (evaluate.split)", "set evaluate.split to a split it has"))
    return {split: needed[split] for split in SPLITS if split in needed}


def check_splits(annotations: dict[str, Any], needed: dict[str, list[tuple[str, str]]], raw: Path, dataset: str,
                 fmt: str) -> None:
    """Every split in ``needed`` must have images; else a CaprlError naming the file, the split,
    why it is needed and what to do."""
    counts = annotations["stats"]["split_images"]
    for split, uses in needed.items():
        if counts.get(split):
            continue
        have = ", ".join(f"{n} {s}" for s, n in counts.items())
        source = SPLIT_SOURCE.get(fmt, "put some of its images in split '{split}'").format(split=split)
        fixes = "".join(f", or {fix}" for _, fix in uses if fix)
        raise CaprlError(f"{raw}: the {split} split of dataset {dataset} is empty ({have} images); "
                         f"{'; '.join(why for why, _ in uses)}. Give it {split} images ({source}){fixes}.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--raw", type=Path, default=None, help="raw description (default: datasets.<name>.raw)")
    parser.add_argument("--media-root", type=Path, default=None,
                        help="folder the media paths are relative to (default: datasets.<name>.media_root)")
    parser.add_argument("--out", required=True, type=Path, help="normalised annotations JSON to write")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    spec = params_mod.dataset_spec(params, args.dataset)
    raw, media_root = Path(args.raw or spec["raw"]), Path(args.media_root or spec["media_root"])
    reader = build_reader(spec["format"], args.dataset)
    video = params_mod.dataset_features(params, args.dataset)["video"]
    annotations = reader.read(raw, media_root, args.dataset, settings=video)
    stats = annotations["stats"]
    check_splits(annotations, needed_splits(params, args.dataset), raw, args.dataset, spec["format"])
    io.write_json(args.out, annotations, indent=None)
    log.info(
        "wrote %s: %d images (%s), %d captions",
        args.out, stats["images"], ", ".join(f"{n} {s}" for s, n in stats["split_images"].items()), stats["captions"],
    )
