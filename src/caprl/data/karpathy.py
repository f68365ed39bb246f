"""The ``karpathy`` format: Karpathy's split JSON -> normalised annotations (COCO, Flickr30k, synthetic).

Input: Karpathy's ``dataset_<name>.json`` ({"images": [{"filepath"?, "filename", "imgid",
"cocoid"?, "split", "sentences": [{"tokens"?, "raw"}]}]}). COCO's file has ``filepath``
(``train2014``/``val2014``) and ``cocoid``; Flickr30k's has neither: its images are
``media_root/filename``, one folder. ``id`` is ``cocoid`` when present (COCO), else ``imgid``
(Flickr30k); ``file`` is ``filepath/filename``, or ``filename`` without a ``filepath``.
Karpathy's ``restval`` split is training data, as in the standard preprocessing. Tokens are
lower-case with punctuation stripped (Karpathy's tokenisation, :func:`tokenize`, which every
format's reader uses); empty captions, and images left with none, are dropped. The output
format is :mod:`caprl.data.prepare`'s.
"""

from __future__ import annotations

import logging
import string
from pathlib import Path
from typing import Any

from caprl import io
from caprl.data import SPLITS
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SPLIT_MAP = {"train": "train", "restval": "train", "val": "val", "test": "test"}
_PUNCTUATION = str.maketrans("", "", string.punctuation)

REAL_DATA_HELP = {
    "coco": (
        "Get dataset_coco.json from Karpathy's 'caption_datasets' release (caption_datasets.zip) and the "
        "COCO 2014 images (train2014/ and val2014/ under datasets.coco.media_root)"
    ),
    "flickr30k": (
        "Get dataset_flickr30k.json from Karpathy's 'caption_datasets' release (caption_datasets.zip) and the "
        "Flickr30k images (flickr30k-images/, the one folder datasets.flickr30k.media_root points at; request "
        "form at https://shannon.cs.illinois.edu/DenotationGraph/)"
    ),
    "synthetic": (
        "Generate it with `caprl synthesize` (the workflow does so when datasets.<name>.generate is true)"
    ),
}


def tokenize(text: str) -> list[str]:
    """Karpathy's tokenisation: lower-case, punctuation removed, split on whitespace."""
    return text.lower().translate(_PUNCTUATION).split()


def missing_json_message(path: Path, dataset: str) -> str:
    how = REAL_DATA_HELP.get(
        dataset, "Get the Karpathy-split file dataset_<name>.json for this dataset and its images"
    )
    return (
        f"Karpathy-split JSON not found: {path} (params datasets.{dataset}.raw). "
        f"{how}; set datasets.{dataset}.raw and datasets.{dataset}.media_root in params.yaml. "
        "See docs/real-data.md."
    )


def read_karpathy(path: str | Path, dataset: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise CaprlError(missing_json_message(p, dataset))
    data = io.read_json(p, what="Karpathy-split JSON")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise CaprlError(f"{p}: expected a JSON object with an 'images' list (Karpathy split format)")
    return data


def _required(image: dict[str, Any], key: str, index: int, source: str) -> Any:
    if key not in image:
        raise CaprlError(f"{source}: images[{index}] has no key '{key}' (Karpathy split format)")
    return image[key]


def _caption_tokens(sentence: Any, index: int, j: int, source: str) -> tuple[list[str], str]:
    where = f"{source}: images[{index}].sentences[{j}]"
    if not isinstance(sentence, dict):
        raise CaprlError(f"{where} is not an object with 'tokens' or 'raw'")
    raw = sentence.get("raw")
    if raw is not None and not isinstance(raw, str):
        raise CaprlError(f"{where}.raw is not a string")
    if "tokens" in sentence:
        tokens = sentence["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise CaprlError(f"{where}.tokens is not a list of strings")
        tokens = tokenize(" ".join(tokens))  # idempotent on Karpathy's tokens
    elif raw is not None:
        tokens = tokenize(raw)
    else:
        raise CaprlError(f"{where} has neither 'tokens' nor 'raw'")
    return tokens, raw if raw is not None else " ".join(tokens)


def prepare_annotations(data: dict[str, Any], dataset: str, source: str = "<karpathy json>") -> dict[str, Any]:
    """Normalise a parsed Karpathy JSON (pure function; ``source`` names the file in errors)."""
    images: list[dict[str, Any]] = []
    first_index: dict[int, int] = {}
    stats = {"images_read": 0, "captions_read": 0, "restval_as_train": 0, "empty_captions_dropped": 0,
             "images_without_captions_dropped": 0}
    for index, image in enumerate(data["images"]):
        if not isinstance(image, dict):
            raise CaprlError(f"{source}: images[{index}] is not a JSON object")
        stats["images_read"] += 1
        split = _required(image, "split", index, source)
        if split not in SPLIT_MAP:
            raise CaprlError(
                f"{source}: images[{index}].split is {split!r}; expected one of {', '.join(SPLIT_MAP)}"
            )
        stats["restval_as_train"] += split == "restval"
        image_id = image.get("cocoid", image.get("imgid"))
        if image_id is None:
            raise CaprlError(f"{source}: images[{index}] has no key 'cocoid' or 'imgid' (Karpathy split format)")
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise CaprlError(f"{source}: images[{index}] id {image_id!r} is not an integer")
        if image_id in first_index:
            raise CaprlError(f"{source}: images[{index}] repeats id {image_id} of images[{first_index[image_id]}]")
        first_index[image_id] = index
        filename = _required(image, "filename", index, source)
        if not isinstance(filename, str) or not filename:
            raise CaprlError(f"{source}: images[{index}].filename must be a non-empty string, not {filename!r}")
        filepath = image.get("filepath") or ""  # absent (Flickr30k): the image is media_root/filename
        if not isinstance(filepath, str):
            raise CaprlError(f"{source}: images[{index}].filepath must be a string, not {filepath!r}")
        sentences = _required(image, "sentences", index, source)
        if not isinstance(sentences, list):
            raise CaprlError(f"{source}: images[{index}].sentences is not a list")
        captions, raws = [], []
        for j, sentence in enumerate(sentences):
            stats["captions_read"] += 1
            tokens, raw = _caption_tokens(sentence, index, j, source)
            if not tokens:
                stats["empty_captions_dropped"] += 1
                log.debug("%s: images[%d].sentences[%d] is empty, dropped", source, index, j)
                continue
            captions.append(tokens)
            raws.append(raw)
        if not captions:
            stats["images_without_captions_dropped"] += 1
            log.debug("%s: images[%d] (id %d) has no non-empty caption, dropped", source, index, image_id)
            continue
        file = f"{filepath.rstrip('/')}/{filename}" if filepath else filename
        images.append({"id": image_id, "file": file, "split": SPLIT_MAP[split], "captions": captions, "raw": raws})
    if not images:
        raise CaprlError(f"{source}: no image with a non-empty caption ({stats['images_read']} images read)")
    images.sort(key=lambda im: im["id"])
    stats["images"] = len(images)
    stats["captions"] = sum(len(im["captions"]) for im in images)
    stats["split_images"] = {s: sum(im["split"] == s for im in images) for s in SPLITS}
    return {"dataset": dataset, "images": images, "stats": stats}


def check_images(annotations: dict[str, Any], image_root: Path, dataset: str) -> None:
    """Every annotated image file must exist under ``image_root`` (content is checked at extraction)."""
    if not image_root.is_dir():
        raise CaprlError(
            f"image root not found: {image_root} (params datasets.{dataset}.media_root). "
            f"{REAL_DATA_HELP.get(dataset, 'Put the images there')}. See docs/real-data.md."
        )
    missing = [im["file"] for im in annotations["images"] if not (image_root / im["file"]).is_file()]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise CaprlError(
            f"{len(missing)} of {len(annotations['images'])} images are missing under {image_root}: {shown}. "
            f"Check datasets.{dataset}.media_root (media_root/filepath/filename, or media_root/filename when the "
            "JSON has no filepath, must exist) or finish the download."
        )


# where a split's images come from, by raw format (for the error naming an empty split)
