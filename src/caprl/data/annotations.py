"""The normalised annotations file (written by ``caprl prepare``) and what is read from it.

Format: ``{"dataset": str, "images": [{"id": int, "file": str, "split": "train"|"val"|"test",
"captions": [[tok, ...], ...], "raw": [str, ...]}, ...]}``. Every stage that reads a dataset
reads it through :func:`load_annotations`; rewards and training get their tokenised
references from :func:`references_from_annotations`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from caprl import io
from caprl.data import SPLITS
from caprl.errors import CaprlError


def load_annotations(path: str | Path) -> dict[str, Any]:
    """Read and validate an annotations file written by ``caprl prepare``."""
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"annotations file not found: {p} (made by `caprl prepare`)")
    data = io.read_json(p, what="annotations file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or "dataset" not in data:
        raise CaprlError(
            f"{p}: not an annotations file (expected 'dataset' and an 'images' list); rerun `caprl prepare`"
        )
    if not data["images"]:
        raise CaprlError(f"{p}: 'images' is empty; rerun `caprl prepare`")
    seen: dict[int, int] = {}
    for index, image in enumerate(data["images"]):
        where = f"{p}: images[{index}]"
        if not isinstance(image, dict):
            raise CaprlError(f"{where} is not a JSON object; rerun `caprl prepare`")
        for key in ("id", "file", "split", "captions", "raw"):
            if key not in image:
                raise CaprlError(f"{where} has no key '{key}'; rerun `caprl prepare`")
        image_id = image["id"]
        if not isinstance(image_id, int) or isinstance(image_id, bool) or image["split"] not in SPLITS:
            raise CaprlError(f"{where}: id must be an integer and split one of {', '.join(SPLITS)}")
        if image_id in seen:
            raise CaprlError(f"{where} repeats id {image_id} of images[{seen[image_id]}]; rerun `caprl prepare`")
        seen[image_id] = index
        if not isinstance(image["file"], str) or not image["file"]:
            raise CaprlError(f"{where}.file must be a non-empty path relative to the image root")
        captions = image["captions"]
        if (
            not isinstance(captions, list)
            or not captions
            or not all(isinstance(c, list) and c and all(isinstance(t, str) for t in c) for c in captions)
        ):
            raise CaprlError(f"{where}.captions must be a non-empty list of non-empty token lists")
        if not isinstance(image["raw"], list) or len(image["raw"]) != len(captions):
            raise CaprlError(f"{where}.raw must be a list with one sentence per caption")
    return data


def references_from_annotations(annotations: dict[str, Any], split: str) -> dict[int, list[list[str]]]:
    """Tokenised reference captions of one split of a normalised annotations dict.

    The normalised format (written by ``caprl prepare``) is ``{"dataset": str, "images":
    [{"id": int, "file": str, "split": "train"|"val"|"test", "captions": [[tok, ...], ...],
    "raw": [str, ...]}, ...]}``. Returns ``{image id: captions}`` in file order.
    """
    images = annotations.get("images") if isinstance(annotations, dict) else None
    if not isinstance(images, list):
        raise CaprlError("annotations: expected an object with an 'images' list")
    refs: dict[int, list[list[str]]] = {}
    for i, image in enumerate(images):
        if not isinstance(image, dict) or "id" not in image or "split" not in image or "captions" not in image:
            raise CaprlError(f"annotations: images[{i}] lacks one of the keys 'id', 'split', 'captions'")
        if image["split"] != split:
            continue
        caps = image["captions"]
        if not isinstance(caps, list) or not all(
            isinstance(c, list) and all(isinstance(t, str) for t in c) for c in caps
        ):
            raise CaprlError(f"annotations: images[{i}] (id {image['id']}): 'captions' must be lists of tokens")
        if not caps:
            raise CaprlError(f"annotations: images[{i}] (id {image['id']}) has no reference captions")
        if image["id"] in refs:
            raise CaprlError(f"annotations: image id {image['id']} appears twice")
        refs[int(image["id"])] = [list(c) for c in caps]
    return refs

