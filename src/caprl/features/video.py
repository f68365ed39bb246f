"""Video features (datasets whose reader has ``media = "video"``, e.g. TGIF): per-frame image
features pooled over time.

Each GIF gives ``frames`` RGB frames sampled uniformly (:func:`caprl.data.gif.sample_frames`,
params.yaml ``features.video.frames``); every frame goes through the dataset's image
backbone exactly as an image does (``Backbone.preprocess`` + ``__call__``), and of its
output only the frame's ``pooled`` vector ``f_t`` (``D`` numbers) is kept (the spatial mean of
the conv map for ResNet; the layout of cells for ``tinycnn``). With ``segments`` = S
(params.yaml ``features.video.segments``, a dataset may override it under its own ``video:``)
the frames fall into S equal runs of consecutive frames (frame t in segment ``t * S // frames``)
and, per GIF::

    pooled     = [mean of f_t over segment 0, ..., mean over segment S-1]   [S * D]
    regions[t] = f_t in block seg(t) of S * D numbers, zeros elsewhere     [frames, S * D]

S = 1 is spatio-temporal mean pooling (``pooled`` = the mean over frames; with ResNet-152 the
2048-d vector of paper 002, sec. 5.1) with one region per frame (attention over time). S = 2
(the built-in video set) keeps the order of events, which a mean over all frames loses: a
shape moving left and one moving right have the same mean, and captions name the direction;
the regions stay summable to the segment sums, and each says when it was seen. The HDF5 layout
is the image one (:func:`caprl.data.feature_store.open_writer`) with ``n_regions = frames``,
``grid = 0`` (the regions are not a spatial grid), ``dim = S * D`` and the attrs ``media =
"video"``, ``frames`` and ``segments``; sharding and merging are unchanged.

``batch_size`` (params.yaml ``features.batch_size``) counts **frames** per backbone call,
as it counts images for images, so the memory of one call is the same: a batch holds
``max(1, batch_size // frames)`` GIFs. GIFs are checked by ``caprl prepare``
(``features.video.on_failure``); one that fails here anyway is a GifError (a CaprlError)
naming the file and the kind of failure.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from PIL import Image
from tqdm import tqdm

from caprl.data.gif import GifError, GifLimits, sample_frames
from caprl.errors import CaprlError
from caprl.features.backbones import Backbone
from caprl.features.media import require_media
from caprl.data.feature_store import open_writer

log = logging.getLogger(__name__)


def video_attrs(backbone: Backbone, frames: int, segments: int = 1) -> dict[str, Any]:
    """The HDF5 attrs of video features: the backbone's, with one region per frame of ``segments`` blocks."""
    return {**backbone.attrs(), "grid": 0, "dim": int(segments) * backbone.dim, "n_regions": int(frames),
            "media": "video", "frames": int(frames), "segments": int(segments)}


def pool_frames(backbone: Backbone, batch: torch.Tensor, frames: int,
                segments: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` = ``[G * frames, 3, S, S]`` preprocessed frames, GIF by GIF ->
    ``(pooled [G, segments * D], regions [G, frames, segments * D])`` (module docstring)."""
    if batch.shape[0] % frames:
        raise ValueError(f"{batch.shape[0]} frames is not a whole number of GIFs of {frames} frames")
    if not 1 <= segments <= frames:
        raise CaprlError(f"features.video.segments must be between 1 and frames ({frames}), got {segments}")
    per_frame, _ = backbone(batch)  # [G * frames, D]
    videos, dim = batch.shape[0] // frames, per_frame.shape[-1]
    frame_rows = per_frame.reshape(videos, frames, dim)
    segment = torch.arange(frames) * segments // frames  # [frames]: each frame's segment
    regions = frame_rows.new_zeros(videos, frames, segments, dim)
    regions[:, torch.arange(frames), segment] = frame_rows
    counts = torch.bincount(segment, minlength=segments).to(frame_rows.dtype)  # frames per segment
    pooled = regions.sum(dim=1) / counts.view(1, -1, 1)  # [G, segments, D]: each segment's mean
    return pooled.reshape(videos, segments * dim), regions.reshape(videos, frames, segments * dim)


def load_frames(path: Path, video_id: int, frames: int, backbone: Backbone, limits: GifLimits,
                source: str) -> list[torch.Tensor]:
    """The ``frames`` preprocessed frames of one GIF; a failure is a GifError saying what to do."""
    try:
        sampled = sample_frames(path, frames, limits=limits)
    except FileNotFoundError:
        raise CaprlError(f"{path}: GIF not found (video id {video_id} in {source}); restore the file under "
                         "the media root (re-download, or re-run caprl synthesize), or pass the right --image-root"
                         ) from None
    except GifError as exc:
        raise exc.with_hint(
            f"video id {video_id} in {source}, which caprl prepare checked: the file changed since, or "
            "features.video did; re-run caprl prepare (features.video.on_failure applies there)") from None
    return [backbone.preprocess(Image.fromarray(frame)) for frame in sampled]


def extract_video_features(
    videos: Sequence[Mapping[str, Any]],
    media_root: str | os.PathLike[str],
    backbone: Backbone,
    out: str | os.PathLike[str],
    batch_size: int,
    frames: int,
    limits: GifLimits = GifLimits(),
    attrs: Mapping[str, Any] | None = None,
    source: str = "the annotations",
    segments: int = 1,
) -> int:
    """Per-frame features of ``videos`` (annotation records with ``id`` and ``file``, a GIF
    relative to ``media_root``), in the given order, written to ``out`` atomically (nothing is
    left there on error). ``batch_size`` counts frames per backbone call (module docstring).
    Returns the number of GIFs written."""
    if frames < 1:
        raise CaprlError(f"features.video.frames must be >= 1, got {frames}")
    root = Path(media_root)
    require_media(videos, root, source, noun="GIF", id_name="video")
    per_batch = max(1, batch_size // frames)
    all_attrs = {**video_attrs(backbone, frames, segments), **(attrs or {})}
    n_batches = (len(videos) + per_batch - 1) // per_batch
    t0 = time.perf_counter()
    with open_writer(out, len(videos), segments * backbone.dim, frames, all_attrs) as writer:
        for b in tqdm(range(n_batches), desc=f"video features {backbone.name}", unit="batch", mininterval=5.0,
                      disable=None):
            chunk = videos[b * per_batch:(b + 1) * per_batch]
            batch = torch.stack([x for v in chunk
                                 for x in load_frames(root / v["file"], int(v["id"]), frames, backbone, limits,
                                                      source)])
            pooled, regions = pool_frames(backbone, batch, frames, segments)
            writer.write([int(v["id"]) for v in chunk], pooled.numpy(), regions.numpy())
    log.info("%d GIFs -> %s (%s, %d frames x %d, %d GIFs per batch) in %.1fs", len(videos), out, backbone.name,
             frames, backbone.dim, per_batch, time.perf_counter() - t0)
    return len(videos)
