"""Animated GIF decoding for video captioning (TGIF): N frames sampled uniformly, as RGB.

Pillow decodes a GIF one frame at a time as it seeks, so memory is bounded by one frame
(plus the sampled ones kept), never the whole file. Every frame is converted to RGB
whatever its mode (palette, greyscale, with transparency, or a frame whose mode differs
from the first one's). TGIF's known failures are classified, so a caller can skip and list
them or stop (``policy``): a file with a single frame, a truncated or corrupt file, and a
file over the size limits.

Two passes use this: ``caprl prepare`` (:func:`probe`, every frame decoded one at a time so a
truncated or corrupt file is found, with ``features.video.on_failure`` deciding: skip and list,
or stop) and ``caprl features`` (:func:`sample_frames`, the frames that go through the backbone).
The settings are params.yaml's ``features.video`` (:data:`VIDEO_DEFAULTS`, :func:`gif_limits`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
from PIL import Image

from caprl.errors import CaprlError

FAILURES = ("single_frame", "corrupt", "too_large")
POLICIES = ("skip", "stop")
# params.yaml features.video (the schema requires every key; these are for callers without params)
VIDEO_DEFAULTS: dict[str, Any] = {"frames": 8, "on_failure": "skip", "max_mib": 64, "segments": 1}


class GifError(CaprlError):
    """A GIF that cannot give frames; ``kind`` is one of :data:`FAILURES`. ``hint`` (optional)
    is appended to the message: where the file comes from and what to do."""

    def __init__(self, path: str | os.PathLike[str], kind: str, detail: str, hint: str = "") -> None:
        self.path, self.kind, self.detail, self.hint = str(path), kind, detail, hint
        super().__init__(f"{path}: {kind.replace('_', ' ')} GIF ({detail})" + (f"; {hint}" if hint else ""))

    def with_hint(self, hint: str) -> "GifError":
        return GifError(self.path, self.kind, self.detail, hint)


@dataclass(frozen=True)
class GifLimits:
    """Files beyond these are ``too_large`` (checked before any frame is decoded)."""

    max_bytes: int = 64 * 2**20
    max_pixels: int = 4096 * 4096  # per frame
    max_frames: int = 10_000


def video_settings(settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """params.yaml ``features.video`` (None: :data:`VIDEO_DEFAULTS`), checked: ``frames`` >= 1,
    ``on_failure`` one of :data:`POLICIES`, ``max_mib`` > 0; optional ``max_pixels`` and
    ``max_frames`` (not in params.yaml: :class:`GifLimits`' defaults) pass through."""
    out = {**VIDEO_DEFAULTS, **(settings or {})}
    if out["on_failure"] not in POLICIES:
        raise CaprlError(f"features.video.on_failure must be 'skip' or 'stop', got {out['on_failure']!r}")
    if int(out["frames"]) < 1 or float(out["max_mib"]) <= 0:
        raise CaprlError(f"features.video: frames must be >= 1 and max_mib > 0, got {out['frames']} and "
                         f"{out['max_mib']}")
    if not 1 <= int(out["segments"]) <= int(out["frames"]):
        raise CaprlError(f"features.video.segments must be between 1 and frames ({out['frames']}), "
                         f"got {out['segments']}")
    return out


def gif_limits(settings: Mapping[str, Any] | None = None) -> GifLimits:
    """The :class:`GifLimits` of ``features.video``: ``max_mib`` -> ``max_bytes``."""
    s = video_settings(settings)
    defaults = GifLimits()
    return GifLimits(max_bytes=int(float(s["max_mib"]) * 2**20),
                     max_pixels=int(s.get("max_pixels", defaults.max_pixels)),
                     max_frames=int(s.get("max_frames", defaults.max_frames)))


@contextlib.contextmanager
def _classified(p: Path) -> Iterator[None]:
    """Pillow's many ways of saying "broken" (OSError "image file is truncated", EOFError,
    SyntaxError, IndexError or struct errors on mangled blocks, ...) -> ``GifError`` ``corrupt``."""
    try:
        yield
    except GifError:
        raise
    except Image.DecompressionBombError as exc:
        raise GifError(p, "too_large", str(exc)) from None
    except MemoryError:
        raise GifError(p, "too_large", "out of memory decoding it") from None
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder failure on a file is a corrupt file
        raise GifError(p, "corrupt", f"{type(exc).__name__}: {exc}") from None


def _open_checked(p: Path, limits: GifLimits) -> Image.Image:
    """Open ``p`` after the byte limit, then check the pixel limit (nothing decoded yet)."""
    n_bytes = p.stat().st_size
    if n_bytes > limits.max_bytes:
        raise GifError(p, "too_large", f"{n_bytes} bytes > {limits.max_bytes}")
    gif = Image.open(p)
    width, height = gif.size
    if width * height > limits.max_pixels:
        gif.close()
        raise GifError(p, "too_large", f"{width}x{height} frames > {limits.max_pixels} pixels")
    return gif


def probe(path: str | os.PathLike[str], limits: GifLimits = GifLimits()) -> int:
    """Check that the GIF at ``path`` can give frames; return its number of frames.

    Bounded memory and cheap enough for every file of a dataset: the limits on bytes and
    pixels are checked before anything is decoded, then the frames are decoded one after the
    other (only the current one is held), which finds a truncated file or corrupt data in any
    frame, and the walk stops as soon as there are more than ``limits.max_frames``. Raises
    :class:`GifError` (``single_frame``, ``corrupt``, ``too_large``); FileNotFoundError as is.
    """
    p = Path(path)
    with _classified(p):
        with _open_checked(p, limits) as gif:
            n_frames = 0
            while True:
                try:
                    gif.seek(n_frames)
                except EOFError:
                    break
                if n_frames >= limits.max_frames:
                    raise GifError(p, "too_large", f"more than {limits.max_frames} frames")
                gif.load()  # decodes this frame's data: a truncated/corrupt frame raises here
                n_frames += 1
    if n_frames < 2:
        raise GifError(p, "single_frame", "a still image, not an animation")
    return n_frames


def uniform_indices(n_frames: int, n: int) -> list[int]:
    """``n`` frame indices spread evenly over ``0 .. n_frames - 1`` (first and last included;
    repeats when the GIF has fewer frames than asked for)."""
    if n_frames < 1 or n < 1:
        raise ValueError(f"need at least one frame and one sample, got {n_frames} and {n}")
    return [int(i) for i in np.linspace(0, n_frames - 1, n).round()]


def sample_frames(path: str | os.PathLike[str], n: int, size: int | None = None,
                  limits: GifLimits = GifLimits()) -> np.ndarray:
    """``[n, H, W, 3]`` uint8 RGB frames sampled uniformly from the GIF at ``path`` (each
    resized to ``size`` x ``size`` if given). Raises :class:`GifError` for the failures."""
    p = Path(path)
    with _classified(p), _open_checked(p, limits) as gif:
        n_frames = getattr(gif, "n_frames", 1)  # walks the file frame by frame (no pixel decoding)
        if n_frames > limits.max_frames:
            raise GifError(p, "too_large", f"{n_frames} frames > {limits.max_frames}")
        if n_frames < 2:
            raise GifError(p, "single_frame", "a still image, not an animation")
        frames = []
        for index in uniform_indices(n_frames, n):
            gif.seek(index)
            frame = gif.convert("RGB")  # palette / L / RGBA / a frame of another mode: all RGB
            if size is not None:
                frame = frame.resize((size, size), Image.BILINEAR)
            frames.append(np.asarray(frame, dtype=np.uint8))
    return np.stack(frames)


@dataclass
class FrameReport:
    """What :func:`decode_all` skipped, by file: ``{path: (kind, detail)}``."""

    skipped: dict[str, tuple[str, str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"{path}\t{kind}\t{detail}" for path, (kind, detail) in sorted(self.skipped.items())]


def decode_all(paths: list[str | os.PathLike[str]], n: int, policy: str = "skip", size: int | None = None,
               limits: GifLimits = GifLimits()) -> tuple[dict[str, np.ndarray], FrameReport]:
    """Frames of every GIF; a failure is skipped and listed (``policy="skip"``) or raised
    (``policy="stop"``, the error names the file and the kind of failure)."""
    if policy not in POLICIES:
        raise CaprlError(f"GIF failure policy must be 'skip' or 'stop', got {policy!r}")
    frames: dict[str, np.ndarray] = {}
    report = FrameReport()
    for path in paths:
        try:
            frames[str(path)] = sample_frames(path, n, size, limits)
        except GifError as exc:
            if policy == "stop":
                raise
            report.skipped[str(path)] = (exc.kind, exc.detail)
    return frames, report
