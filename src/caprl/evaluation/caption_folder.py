"""The images ``caprl caption`` reads (:mod:`caprl.evaluation.caption`): the files of its
``--images`` (:func:`find_images`), why an unreadable one is skipped (:func:`skip_reason`), and
the batch reader that puts them through the backbone and keeps the page's thumbnails
(:class:`BatchReader`)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from PIL import Image

from caprl.errors import CaprlError
from caprl.evaluation import caption_page
from caprl.features.backbones import Backbone

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
_UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclass(frozen=True)
class ImageFile:
    name: str  # relative to the folder it was found in (the file as given, for a file)
    path: Path


def identity(path: Path) -> Path:
    """The file ``path`` names, for finding it twice; the path itself where it names none (a link loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python 3.11's "Symlink loop"
        return path.absolute()


def find_images(inputs: Sequence[str]) -> list[ImageFile]:
    """The image files of ``inputs`` (folders: every entry with an image suffix, recursively, in
    name order; files: as given), each once; a CaprlError for a path that does not exist. An entry
    named like an image that is none (a folder, a link loop or broken link) is listed too: the
    reading skips it, saying why."""
    found: dict[Path, ImageFile] = {}
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise CaprlError(f"--images {given}: no image files in this folder ({', '.join(IMAGE_SUFFIXES)})")
            for p in files:
                found.setdefault(identity(p), ImageFile(p.relative_to(path).as_posix(), p))
        elif path.exists() or path.is_symlink():  # a file, or a link to none (skipped with its reason)
            found.setdefault(identity(path), ImageFile(given, path))
        else:
            raise CaprlError(f"--images {given}: no such file or folder")
    return list(found.values())


def read_image(path: Path) -> Image.Image:
    """The fully decoded RGB image; an OSError (PIL's ValueError, ...) for a path that is not one:
    a folder, a FIFO or device (never opened: reading one could wait for ever), a link loop, a
    file it may not read, a file PIL cannot decode."""
    mode = os.stat(path).st_mode  # follows links: a loop or a broken link fails here
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise OSError(f"not a regular file (a {'FIFO' if stat.S_ISFIFO(mode) else 'socket or device'}): {path}")
    with Image.open(path) as img:
        img.load()
        return img.convert("RGB")


_WHY = {errno.EISDIR: "a folder, not an image file", errno.ELOOP: "a symbolic link loop",
        errno.EACCES: "no permission to read it", errno.EPERM: "no permission to read it"}


def skip_reason(path: Path, exc: BaseException) -> str:
    """Why ``path`` is skipped: what it is, then the error (``Type: message``)."""
    detail = f"{type(exc).__name__}: {exc}"
    why = _WHY.get(getattr(exc, "errno", None) or 0)
    if getattr(exc, "errno", None) == errno.ENOENT:
        why = f"a broken symbolic link to {os.readlink(path)}" if path.is_symlink() else "removed since it was listed"
    return f"{why} ({detail})" if why else detail


@dataclass
class ReadBatch:
    """One batch of files read (:class:`BatchReader`): the readable ones' features
    (``pooled [n, D]``, ``regions [n, R, D]``; None where none is readable), the page's
    :class:`~caprl.evaluation.caption_page.Views` of each (none without a page), the others'
    ``{"file", "path", "reason"}``."""

    files: list[ImageFile]
    skipped: list[dict[str, str]]
    pooled: torch.Tensor | None
    regions: torch.Tensor | None
    views: list[caption_page.Views]


class BatchReader:
    """Reads a batch of files through ``backbone`` (``regions``: with the grid's features, else
    none): each image is decoded, made the backbone's input (and, with ``page``, the page's
    thumbnails) and let go before the next is read, so a batch never holds more than one
    full-size image. A file that cannot be read is skipped with one warning naming it."""

    def __init__(self, backbone: Backbone, regions: bool = True, page: bool = False) -> None:
        self.backbone, self.regions, self.page = backbone, regions, page

    def __call__(self, files: Sequence[ImageFile]) -> ReadBatch:
        good, skipped, inputs, views = [], [], [], []
        for f in files:
            try:
                rgb = read_image(f.path)
            except _UNREADABLE as exc:
                reason = skip_reason(f.path, exc)
                log.warning("%s: skipped, not a readable image: %s", f.path, reason)
                skipped.append({"file": f.name, "path": str(f.path), "reason": reason})
                continue
            good.append(f)
            inputs.append(self.backbone.preprocess(rgb))
            if self.page:
                views.append(caption_page.views_of(f.path, rgb, self.backbone.grid))
            del rgb
        if not good:
            return ReadBatch(good, skipped, None, None, views)
        pooled, grid = self.backbone(torch.stack(inputs))
        return ReadBatch(good, skipped, pooled, grid if self.regions else grid[:, :0], views)
