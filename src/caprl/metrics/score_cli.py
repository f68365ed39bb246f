"""``caprl score``: score a COCO results file against COCO-format references; prints JSON.

REFS is the COCO caption-annotation format ``{"images": [...], "annotations": [{"image_id",
"id", "caption"}, ...]}``; RESULTS the COCO results format ``[{"image_id", "caption"}, ...]``.
Needs no params.yaml.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from caprl.errors import CaprlError
from caprl.io import read_json, write_json
from caprl.metrics.official import METRICS, OfficialScorer

log = logging.getLogger(__name__)


def load_references(path: str | Path) -> dict[int, list[str]]:
    """COCO caption annotations -> ``{image_id: [raw caption, ...]}``; CaprlError naming the problem."""
    data = read_json(path, "references file")
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise CaprlError(f"{path}: expected COCO caption annotations: an object with an 'annotations' list")
    refs: dict[int, list[str]] = {}
    for i, ann in enumerate(data["annotations"]):
        image_id, caption = _entry(ann, f"{path}: annotations[{i}]")
        refs.setdefault(image_id, []).append(caption)
    images = data.get("images")
    if isinstance(images, list):
        for i, image in enumerate(images):
            if not isinstance(image, dict) or not _is_int(image.get("id")):
                raise CaprlError(f"{path}: images[{i}] must be an object with an integer 'id'")
    return refs


def load_results(path: str | Path) -> dict[int, str]:
    """COCO results -> ``{image_id: caption}``; CaprlError on bad structure or duplicate ids."""
    data = read_json(path, "results file")
    if not isinstance(data, list):
        raise CaprlError(f"{path}: expected COCO results: a list of {{'image_id', 'caption'}} objects")
    results: dict[int, str] = {}
    for i, entry in enumerate(data):
        image_id, caption = _entry(entry, f"{path}: [{i}]")
        if image_id in results:
            raise CaprlError(f"{path}: [{i}]: image_id {image_id} has more than one caption")
        results[image_id] = caption
    if not results:
        raise CaprlError(f"{path}: no results to score")
    return results


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(entry: Any, where: str) -> tuple[int, str]:
    if not isinstance(entry, dict):
        raise CaprlError(f"{where}: expected an object with 'image_id' and 'caption'")
    for key in ("image_id", "caption"):
        if key not in entry:
            raise CaprlError(f"{where}: missing key '{key}'")
    if not _is_int(entry["image_id"]):
        raise CaprlError(f"{where}: 'image_id' must be an integer, got {entry['image_id']!r}")
    if not isinstance(entry["caption"], str):
        raise CaprlError(f"{where}: 'caption' must be a string")
    return entry["image_id"], entry["caption"]


def score_files(refs_path: str | Path, results_path: str | Path, metrics: list[str], per_image: bool) -> dict[str, Any]:
    """Load both files, check that every result has references, and score."""
    refs = load_references(refs_path)
    results = load_results(results_path)
    missing = [i for i in results if i not in refs]
    if missing:
        shown = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CaprlError(f"{results_path}: {len(missing)} image id(s) not found in {refs_path}: {shown}")
    if len(results) < len(refs):
        log.warning(
            "%s covers %d of the %d images of %s; scoring those", results_path, len(results), len(refs), refs_path
        )
    with OfficialScorer() as scorer:
        return scorer.score(refs, results, metrics=metrics, per_image=per_image)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--refs", required=True, help="COCO caption annotations JSON (references)")
    parser.add_argument("--results", required=True, help="COCO results JSON: [{image_id, caption}]")
    parser.add_argument("--metrics", nargs="+", choices=METRICS, default=list(METRICS), help="metrics (default: all)")
    parser.add_argument("--per-image", action="store_true", help="also report every image's scores")
    parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")


def main(args: argparse.Namespace) -> None:
    scores = score_files(args.refs, args.results, list(args.metrics), args.per_image)
    if args.out:
        write_json(args.out, scores)
    json.dump(scores, sys.stdout, indent=1)
    sys.stdout.write("\n")
