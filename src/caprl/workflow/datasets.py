"""The enabled datasets of the plan (:mod:`caprl.workflow.plan`) and their files: the raw file
(and what its format reads beside it), the media, the features (extracted, or converted from
bottom-up TSV files), and why the DAG cannot start for one whose raw files are missing
(:meth:`Dataset.missing_raw`). Pure Python: only :meth:`Dataset.missing_raw` looks at the disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from caprl.errors import CaprlError
from caprl.io.layout import ANNOTATIONS, CIDER_DF, FEATURES, LABELS, RAW_LOGS, REFS, SHARD, SHARD_DIR, VOCAB
from caprl.params import BOTTOMUP

# what `caprl synthesize` writes, by raw format: the raw file and the media folder
GENERATED = {"karpathy": ("data/raw/{dataset}/dataset_{dataset}.json", "data/raw/{dataset}/images"),
             "tgif": ("data/raw/{dataset}/tgif-v1.0.tsv", "data/raw/{dataset}/gifs")}
GENERATED_RAW, GENERATED_MEDIA = GENERATED["karpathy"]
RAW_HELP = {
    "karpathy": "Karpathy's split file dataset_coco.json / dataset_flickr30k.json from his caption_datasets release",
    "tgif": "tgif-v1.0.tsv from the TGIF release, with its split lists train.txt, val.txt, test.txt beside it",
}
# backbone bottomup (caprl bottomup): where its TSV files come from; `caprl download` does not fetch them
BOTTOMUP_HELP = ("trainval_36.zip from https://github.com/peteanderson80/bottom-up-attention, README 'Pretrained "
                 "features', '36 features per image (fixed)': the COCO 2014 train+val images; unzipped it holds "
                 "trainval_36/trainval_resnet101_faster_rcnn_genome_36.tsv. caprl download does not fetch it")
# files a raw format reads beside its raw file (TGIF's official split lists)
RAW_SIDE_FILES = {"tgif": ("train.txt", "val.txt", "test.txt")}


@dataclass(frozen=True)
class Dataset:
    """An enabled dataset and its files. ``bottomup_tsv``: with backbone bottomup, the TSV files its
    features file is converted from (``caprl bottomup``) instead of extracted from its images."""

    name: str
    format: str
    raw: str
    media_root: str
    generate: bool
    backbone: str
    bottomup_tsv: tuple[str, ...] = ()

    @property
    def bottomup(self) -> bool:
        return self.backbone == BOTTOMUP

    @property
    def annotations(self) -> str:
        return ANNOTATIONS.format(dataset=self.name)

    @property
    def raw_files(self) -> list[str]:
        """The raw file and the files its format reads beside it (TGIF: the split lists)."""
        side = RAW_SIDE_FILES.get(self.format, ())
        return [self.raw, *(os.path.join(os.path.dirname(self.raw), name) for name in side)]

    @property
    def vocab(self) -> str:
        return VOCAB.format(dataset=self.name)

    @property
    def labels(self) -> str:
        return LABELS.format(dataset=self.name)

    @property
    def cider_df(self) -> str:
        return CIDER_DF.format(dataset=self.name)

    @property
    def features(self) -> str:
        return FEATURES.format(dataset=self.name, backbone=self.backbone)

    @property
    def shard_dir(self) -> str:
        return SHARD_DIR.format(dataset=self.name, backbone=self.backbone)

    def shard(self, shard: int) -> str:
        return SHARD.format(dataset=self.name, backbone=self.backbone, shard=shard)

    def refs(self, split: str) -> str:
        return REFS.format(dataset=self.name, split=split)

    def log(self, name: str) -> str:
        """``logs/<dataset>/<name>``."""
        return f"{RAW_LOGS.format(dataset=self.name)}/{name}"

    def missing_raw(self) -> str | None:
        """Why the DAG cannot start for this dataset (its raw file or a bottom-up TSV is missing), or None."""
        reasons = []
        if not (self.generate or os.path.exists(self.raw)):
            what = RAW_HELP.get(self.format, "the raw file its reader (format) reads")
            reasons.append(f"datasets.{self.name}.raw: {self.raw} does not exist. Put the dataset's raw file there "
                           f"({what}) and its media under {self.media_root}, or set "
                           f"datasets.{self.name}.enabled: false. See docs/real-data.md.")
        missing = [path for path in self.bottomup_tsv if not os.path.exists(path)]
        if missing:
            reasons.append(f"datasets.{self.name}.bottomup_tsv: {', '.join(missing)} "
                           f"{'does' if len(missing) == 1 else 'do'} not exist. Put the bottom-up features there "
                           f"({BOTTOMUP_HELP}), or drop bottomup_tsv and set datasets.{self.name}.backbone to one "
                           f"caprl extracts from images ({', '.join(_image_backbones())}). See docs/real-data.md.")
        return "\n".join(reasons) or None


def _image_backbones() -> list[str]:
    """The backbones caprl extracts features with (the registry's names)."""
    from caprl.features.backbones import BACKBONES

    return list(BACKBONES)


def check_generated(spec: dict[str, Any]) -> None:
    """A generated dataset lives where the synthesize rule of its format writes it."""
    if not spec["generate"]:
        return
    name = spec["name"]
    if spec["format"] not in GENERATED:
        raise CaprlError(f"datasets.{name}.generate: the built-in generator writes {', '.join(GENERATED)}, "
                         f"not '{spec['format']}'")
    for key, pattern in zip(("raw", "media_root"), GENERATED[spec["format"]]):
        if spec[key] != pattern.format(dataset=name):
            raise CaprlError(f"datasets.{name}.{key}: a generated dataset (generate: true) is written to "
                             f"{pattern.format(dataset=name)}; set {key} to that")
