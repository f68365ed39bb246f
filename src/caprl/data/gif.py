"""Animated GIF decoding for video captioning (TGIF): N frames sampled uniformly, as RGB.

Pillow decodes a GIF one frame at a time as it seeks, so memory is bounded by one frame
(plus the sampled ones kept), never the whole file. Every frame is converted to RGB
whatever its mode (palette, greyscale, with transparency, or a frame whose mode differs
from the first one's). TGIF's known failures are classified, so a caller can skip and list
them or stop (``policy``): a file with a single frame, a truncated or corrupt file, and a
file over the size limits.

(First slice of issue 10: the TGIF reader and the per-frame backbone build on this.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from caprl.errors import CaprlError

FAILURES = ("single_frame", "corrupt", "too_large")


class GifError(CaprlError):
    """A GIF that cannot give frames; ``kind`` is one of :data:`FAILURES`."""

    def __init__(self, path: str | os.PathLike[str], kind: str, detail: str) -> None:
        self.path, self.kind, self.detail = str(path), kind, detail
        super().__init__(f"{path}: {kind.replace('_', ' ')} GIF ({detail})")


@dataclass(frozen=True)
class GifLimits:
    """Files beyond these are ``too_large`` (checked before any frame is decoded)."""

    max_bytes: int = 64 * 2**20
    max_pixels: int = 4096 * 4096  # per frame
    max_frames: int = 10_000


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
    n_bytes = p.stat().st_size
    if n_bytes > limits.max_bytes:
        raise GifError(p, "too_large", f"{n_bytes} bytes > {limits.max_bytes}")
    try:
        with Image.open(p) as gif:
            width, height = gif.size
            if width * height > limits.max_pixels:
                raise GifError(p, "too_large", f"{width}x{height} frames > {limits.max_pixels} pixels")
            n_frames = getattr(gif, "n_frames", 1)  # walks the file frame by frame
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
    except GifError:
        raise
    except (OSError, EOFError, SyntaxError, ValueError) as exc:  # Pillow's ways of saying "broken"
        raise GifError(p, "corrupt", f"{type(exc).__name__}: {exc}") from None
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
    if policy not in ("skip", "stop"):
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
