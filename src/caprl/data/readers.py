"""Readers of raw datasets, by ``datasets.<name>.format``: raw files -> normalised annotations.

A reader turns a dataset's raw description (``raw``) and media folder (``media_root``) into
the annotations ``caprl prepare`` writes (see :mod:`caprl.data.prepare` for that format),
checking that every media file it names exists. Adding a format is one class here::

    @register_reader("myformat")
    class MyReader(Reader):
        def read(self, raw, media_root, dataset): ...

``karpathy``: Karpathy's split JSON (COCO, Flickr30k, the built-in synthetic set).
``tgif``: TGIF video captions (caprl.data.tgif); enabled once its per-frame features land (issue 10).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, ClassVar

from caprl.errors import CaprlError
from caprl.registry import Registry

log = logging.getLogger(__name__)


class Reader:
    """Reads one raw format. ``unavailable``: why it cannot read yet (None: it can);
    ``generated``: the built-in generator (``caprl synthesize``) writes this format."""

    name: ClassVar[str] = ""
    unavailable: ClassVar[str | None] = None
    generated: ClassVar[bool] = False

    def read(self, raw: Path, media_root: Path, dataset: str) -> dict[str, Any]:
        raise NotImplementedError


READERS: Registry[type[Reader]] = Registry("dataset format")


def register_reader(name: str) -> Callable[[type[Reader]], type[Reader]]:
    return READERS.register_class(name)


def build_reader(fmt: str, dataset: str) -> Reader:
    """The reader of ``datasets.<dataset>.format``; CaprlError naming that key if it has none."""
    cls = READERS.get(fmt, where=f"datasets.{dataset}.format")
    if cls.unavailable:
        raise CaprlError(f"datasets.{dataset}.format: {fmt}: {cls.unavailable}")
    return cls()


@register_reader("karpathy")
class KarpathyReader(Reader):
    """Karpathy's ``dataset_<name>.json`` + the images under ``media_root``."""

    generated = True

    def read(self, raw: Path, media_root: Path, dataset: str) -> dict[str, Any]:
        from caprl.data.prepare import check_images, prepare_annotations, read_karpathy

        annotations = prepare_annotations(read_karpathy(raw, dataset), dataset, source=str(raw))
        stats = annotations["stats"]
        if stats["empty_captions_dropped"] or stats["images_without_captions_dropped"]:
            log.warning("%s: dropped %d empty captions and %d images left without captions", raw,
                        stats["empty_captions_dropped"], stats["images_without_captions_dropped"])
        if stats["restval_as_train"]:
            log.info("%d 'restval' images counted as train", stats["restval_as_train"])
        check_images(annotations, media_root, dataset)
        return annotations


@register_reader("tgif")
class TgifReader(Reader):
    """TGIF (Li et al. 2016): animated GIFs with one or more sentences each (caprl.data.tgif).

    Not enabled in the DAG until its per-frame features land (issue 10): the reader and the
    GIF decoding (caprl.data.gif) are in and tested."""

    unavailable = "TGIF video features land with issue 10 (SLE + video)"

    def read(self, raw: Path, media_root: Path, dataset: str) -> dict[str, Any]:
        from caprl.data.tgif import read_tgif

        return read_tgif(raw, media_root, dataset)
