"""Readers of raw datasets, by ``datasets.<name>.format``: raw files -> normalised annotations.

A reader turns a dataset's raw description (``raw``) and media folder (``media_root``) into
the annotations ``caprl prepare`` writes (see :mod:`caprl.data.prepare` for that format),
checking that every media file it names exists. Adding a format is one class here::

    @register_reader("myformat")
    class MyReader(Reader):
        media = "image"                      # or "video": what caprl features does with the files
        def read(self, raw, media_root, dataset, *, settings=None): ...

``settings`` is params.yaml ``features.video`` (passed by ``caprl prepare``; None: its
defaults, :data:`caprl.data.gif.VIDEO_DEFAULTS`); image readers ignore it.

``karpathy``: Karpathy's split JSON (COCO, Flickr30k, the built-in synthetic set; caprl.data.karpathy).
``tgif``: TGIF video captions (caprl.data.tgif): animated GIFs, probed at prepare time
(``features.video.on_failure``), features per frame pooled over time (caprl.features.video).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from caprl.data.karpathy import check_images, prepare_annotations, read_karpathy
from caprl.errors import CaprlError
from caprl.params import BOTTOMUP
from caprl.registry import Registry

log = logging.getLogger(__name__)


class Reader:
    """Reads one raw format. ``unavailable``: why it cannot read yet (None: it can);
    ``generated``: the built-in generator (``caprl synthesize``) writes this format;
    ``media``: ``image`` or ``video`` (how ``caprl features`` turns a file into features)."""

    name: ClassVar[str] = ""
    unavailable: ClassVar[str | None] = None
    generated: ClassVar[bool] = False
    media: ClassVar[str] = "image"

    def read(self, raw: Path, media_root: Path, dataset: str, *,
             settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The annotations; ``settings``: params.yaml ``features.video`` (None: its defaults)."""
        raise NotImplementedError


READERS: Registry[type[Reader]] = Registry("dataset format")


def register_reader(name: str) -> Callable[[type[Reader]], type[Reader]]:
    return READERS.register_class(name)


def media_of(fmt: str, dataset: str) -> str:
    """``image`` or ``video``: the media of ``datasets.<dataset>.format``."""
    return READERS.get(fmt, where=f"datasets.{dataset}.format").media


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

    def read(self, raw: Path, media_root: Path, dataset: str, *,
             settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
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

    Every GIF is probed; the broken ones are skipped and listed or stop prepare, by
    ``settings["on_failure"]`` (params.yaml ``features.video``). ``generated``: the built-in
    generator writes this format too (datasets of ``format: tgif`` with ``generate: true``,
    e.g. ``synthetic_video``)."""

    generated = True
    media = "video"

    def read(self, raw: Path, media_root: Path, dataset: str, *,
             settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from caprl.data.tgif import read_tgif

        return read_tgif(raw, media_root, dataset, settings)


def check_datasets(params: dict[str, Any]) -> None:
    """Every dataset of ``datasets:`` against its reader (its format is registered; ``generate``
    only for a format the built-in generator writes; ``backbone: bottomup`` only for images, with
    its TSVs); CaprlError naming the key. Run by the workflow plan, beside :func:`caprl.params.check`."""
    for name, spec in params["datasets"].items():
        reader = READERS.get(spec["format"], where=f"datasets.{name}.format")
        if spec["generate"] and not reader.generated:
            generated = ", ".join(n for n, r in READERS.items() if r.generated)
            raise CaprlError(f"datasets.{name}.generate: the built-in generator writes the formats {generated}, "
                             f"not '{spec['format']}'")
        _check_bottomup(name, spec, reader.media)


def _check_bottomup(name: str, spec: dict[str, Any], media: str) -> None:
    """``backbone: bottomup`` reads its features from the image TSVs of ``bottomup_tsv``, which only it reads."""
    if spec["backbone"] != BOTTOMUP:
        if "bottomup_tsv" in spec:
            raise CaprlError(f"datasets.{name}.bottomup_tsv: only read with backbone: {BOTTOMUP} (this dataset's "
                             f"backbone is {spec['backbone']}); remove it or set datasets.{name}.backbone: {BOTTOMUP}")
        return
    if not spec.get("bottomup_tsv"):
        raise CaprlError(f"datasets.{name}.bottomup_tsv: backbone {BOTTOMUP} converts bottom-up-attention's feature "
                         "TSV files; list them here (e.g. [data/raw/coco/trainval_36/"
                         "trainval_resnet101_faster_rcnn_genome_36.tsv])")
    if media != "image":
        raise CaprlError(f"datasets.{name}.backbone: {BOTTOMUP} features are of images, and format "
                         f"{spec['format']} holds {media}s; choose a backbone caprl extracts from {media}s (caprl.features.backbones)")
