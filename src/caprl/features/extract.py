"""``caprl features``: extract one shard of a dataset's image features into one HDF5 file.

Sharding: the images are sorted by id and shard ``i`` of ``n`` (``n = len(features.shards)``)
takes every n-th one, ``images_sorted[i::n]`` -- shards are balanced, each is ascending in
id, and together they cover every image exactly once. ``caprl merge-features`` joins them.

Video datasets (the reader of ``datasets.<name>.format`` has ``media = "video"``, e.g. tgif)
go through :func:`caprl.features.video.extract_video_features` instead: ``features.video.frames``
frames per GIF through the same backbone, pooled over time (``batch_size`` counts frames).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from PIL import Image
from tqdm import tqdm

from caprl.io import provenance
from caprl.data.annotations import load_annotations
from caprl.errors import CaprlError
from caprl.features.backbones import Backbone, build_backbone
from caprl.features.media import require_media
from caprl.data.feature_store import open_writer

log = logging.getLogger(__name__)

_IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def shard_count(shard: int, shards: Sequence[int]) -> int:
    """The number of shards ``n`` (``features.shards`` must be 0..n-1); check ``shard`` is one of them."""
    n = len(shards)
    if sorted(shards) != list(range(n)):
        raise CaprlError(f"params.yaml features.shards must list the ids 0..{n - 1} once each, got {list(shards)}")
    if shard not in range(n):
        raise CaprlError(f"--shard {shard}: params.yaml features.shards defines shards 0..{n - 1}")
    return n


def shard_images(images: Sequence[Mapping[str, Any]], shard: int, n_shards: int) -> list[Mapping[str, Any]]:
    """Shard ``shard`` of ``n_shards``: every n-th image of the images sorted by id."""
    return sorted(images, key=lambda im: int(im["id"]))[shard::n_shards]


def load_image(path: Path, image_id: int, source: str) -> Image.Image:
    """Open and fully decode one image; a missing or corrupt file is a CaprlError naming it."""
    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except FileNotFoundError:
        raise CaprlError(
            f"{path}: image not found (image id {image_id} in {source}); restore the file under the image "
            "root (re-download, or re-run caprl synthesize), or pass the right --image-root"
        ) from None
    except _IMAGE_ERRORS as exc:
        raise CaprlError(
            f"{path}: cannot decode image (image id {image_id} in {source}): {exc}; replace the file "
            "with a good copy (re-download, or re-run caprl synthesize)"
        ) from exc


def extract_features(
    images: Sequence[Mapping[str, Any]],
    image_root: str | os.PathLike[str],
    backbone: Backbone,
    out: str | os.PathLike[str],
    batch_size: int,
    attrs: Mapping[str, Any] | None = None,
    source: str = "the annotations",
) -> int:
    """Run ``backbone`` over ``images`` (in the given order) in batches; write ``out`` atomically.

    ``images`` are annotation records with ``id`` and ``file`` (relative to ``image_root``).
    The file layout is documented in :func:`caprl.data.feature_store.open_writer`; ``attrs`` are
    added to the backbone's own. Returns the number of images written. On any error (e.g. a
    missing or corrupt image) nothing is left at ``out``.
    """
    root = Path(image_root)
    require_media(images, root, source)
    all_attrs = {**backbone.attrs(), **(attrs or {})}
    n_batches = (len(images) + batch_size - 1) // batch_size
    t0 = time.perf_counter()
    with open_writer(out, len(images), backbone.dim, backbone.n_regions, all_attrs) as writer:
        for b in tqdm(range(n_batches), desc=f"features {backbone.name}", unit="batch", mininterval=5.0, disable=None):
            chunk = images[b * batch_size:(b + 1) * batch_size]
            batch = torch.stack(
                [backbone.preprocess(load_image(root / im["file"], int(im["id"]), source)) for im in chunk]
            )
            pooled, regions = backbone(batch)
            writer.write([int(im["id"]) for im in chunk], pooled.numpy(), regions.numpy())
    log.info("%d images -> %s (%s, %d regions x %d) in %.1fs", len(images), out, backbone.name,
             backbone.n_regions, backbone.dim, time.perf_counter() - t0)
    return len(images)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: (its backbone)")
    parser.add_argument("--annotations", required=True, help="normalised annotations JSON (from caprl prepare)")
    parser.add_argument("--image-root", required=True, help="folder the annotations' image paths are relative to")
    parser.add_argument("--shard", type=int, required=True, help="shard id, one of params.yaml features.shards")
    parser.add_argument("--out", required=True, help="output HDF5 file of this shard")


def main(args: argparse.Namespace) -> None:
    from caprl.data.readers import media_of
    from caprl.params import dataset_features, dataset_spec, load
    from caprl.seeding import seed_everything

    params = load(args.params)
    spec = dataset_spec(params, args.dataset)
    # the backbone is the dataset's; its settings (features.<backbone>) are global, video's per dataset
    features = dataset_features(params, args.dataset)
    n_shards = shard_count(args.shard, features["shards"])
    if features["num_threads"] > 0:
        torch.set_num_threads(features["num_threads"])
    seed_everything(params["seed"])  # random-weight backbones: the same weights in every shard
    annotations = load_annotations(args.annotations)
    images = shard_images(annotations["images"], args.shard, n_shards)
    backbone = build_backbone(features)
    media = media_of(spec["format"], args.dataset)
    log.info("shard %d of %d: %d of %d %ss, backbone %s", args.shard, n_shards, len(images),
             len(annotations["images"]), media, backbone.name)
    attrs = {"dataset": args.dataset, provenance.SHA: provenance.fingerprint(annotations), "shard": args.shard,
             "n_shards": n_shards}
    if media == "video":
        from caprl.data.gif import gif_limits, video_settings
        from caprl.features.video import extract_video_features

        video = video_settings(features.get("video"))
        extract_video_features(images, args.image_root, backbone, args.out, features["batch_size"],
                               int(video["frames"]), gif_limits(video), attrs=attrs, source=str(args.annotations),
                               segments=int(video["segments"]))
        return
    extract_features(images, args.image_root, backbone, args.out, features["batch_size"], attrs=attrs,
                     source=str(args.annotations))
