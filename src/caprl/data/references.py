"""``caprl references``: one split's reference captions in the official COCO caption format.

Written as the COCO ``captions_*.json`` annotation files are, so pycocotools/pycocoevalcap
read it unchanged::

    {"info": {...}, "licenses": [], "type": "captions", "images": [{"id": int}, ...],
     "annotations": [{"image_id": int, "id": int, "caption": str}, ...]}

Captions are the raw sentences: evaluation re-tokenises them with the PTB tokenizer.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from caprl import io, params as params_mod
from caprl.io import provenance
from caprl.data import SPLITS
from caprl.data.annotations import load_annotations
from caprl.errors import CaprlError

log = logging.getLogger(__name__)


def build_references(annotations: dict[str, Any], split: str) -> dict[str, Any]:
    """COCO-format references of ``split``; annotation ids count from 0 in image-id order."""
    if split not in SPLITS:
        raise CaprlError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    images = [im for im in annotations["images"] if im["split"] == split]
    if not images:
        raise CaprlError(f"the annotations have no '{split}' images")
    images.sort(key=lambda im: im["id"])
    refs = []
    for image in images:
        for caption in image["raw"]:
            refs.append({"image_id": image["id"], "id": len(refs), "caption": caption})
    return {
        "info": {"description": f"caprl references: {annotations['dataset']} {split}",
                 "made_from": provenance.record(annotations)},
        "licenses": [],
        "type": "captions",
        "images": [{"id": im["id"]} for im in images],
        "annotations": refs,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--annotations", required=True, type=Path, help="annotations JSON from `caprl prepare`")
    parser.add_argument("--split", choices=SPLITS, default=None, help="split (default: params evaluate.split)")
    parser.add_argument("--out", required=True, type=Path, help="COCO-format references JSON to write")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    split = args.split or params["evaluate"]["split"]
    references = build_references(load_annotations(args.annotations), split)
    io.write_json(args.out, references, indent=None)
    log.info("wrote %s: %d %s images, %d references", args.out, len(references["images"]), split,
             len(references["annotations"]))
