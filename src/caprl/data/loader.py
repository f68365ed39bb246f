"""What the trainer and the evaluator read: labels, vocabulary, features, references.

A thin adapter over the data, features and rewards packages, so the training loop sees one
object with batch-level methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from caprl.io import provenance
from caprl.errors import CaprlError
from caprl.data.annotations import load_annotations
from caprl.data.vocab import Labels, Vocab
from caprl.data.feature_store import Features, open_features_file
from caprl.data.batch import Batch
from caprl.data.annotations import references_from_annotations


@dataclass
class Loading:
    """How features are read (``loading:`` in params.yaml).

    ``in_memory``: true reads the whole features file once; false streams rows from disk
    through an LRU cache of ``cache_mib`` (the process's memory then does not grow with the
    dataset); "auto" keeps files up to ``in_memory_max_mib`` in memory. ``prefetch`` batches
    are read ahead by a background thread while the current step runs.
    """

    in_memory: bool | str = "auto"
    in_memory_max_mib: int = 1024
    cache_mib: int = 64
    prefetch: int = 2

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Loading":
        return cls(**params["loading"])

    def keep_in_memory(self, path: str) -> bool:
        if isinstance(self.in_memory, bool):
            return self.in_memory
        return Path(path).stat().st_size <= self.in_memory_max_mib * 2**20


@dataclass
class DataPaths:
    annotations: str
    vocab: str
    labels: str
    features: str


def add_data_arguments(parser: Any) -> None:
    """The data inputs every model-reading stage takes (train, evaluate, attention-figure)."""
    for name in ("annotations", "vocab", "labels", "features"):
        parser.add_argument(f"--{name}", required=True)


class CaptionData:
    @classmethod
    def from_args(cls, args: Any, loading: Loading | None = None) -> "CaptionData":
        return cls(DataPaths(args.annotations, args.vocab, args.labels, args.features), loading)

    def __init__(self, paths: DataPaths, loading: Loading | None = None) -> None:
        self.paths = paths
        self.loading = loading or Loading()
        self.vocab = Vocab.load(paths.vocab)
        self.labels = Labels(paths.labels)
        open_features_file(paths.features).close()  # a missing file is named before its size is asked
        self.features = Features(paths.features, in_memory=self.loading.keep_in_memory(paths.features),
                                 cache_bytes=self.loading.cache_mib * 2**20)
        self.annotations: dict[str, Any] = load_annotations(paths.annotations)
        self.check_provenance()

    def check_provenance(self) -> None:
        """The inputs belong together: labels of this vocabulary, features and labels made from
        these annotations (:mod:`caprl.io.provenance`)."""
        p = self.paths
        if self.labels.vocab_sha256 != self.vocab.sha256:
            raise CaprlError(f"{p.labels} was encoded with another vocabulary (sha256 {self.labels.vocab_sha256[:12]}) "
                             f"than {p.vocab} ({self.vocab.sha256[:12]}); make both again with `caprl vocab` "
                             f"from {p.annotations}")
        provenance.check(p.features, self.features.attrs, p.annotations, self.annotations,
                         "`snakemake <its features file>`, or caprl features + caprl merge-features")
        provenance.check(p.labels, self.labels.attrs, p.annotations, self.annotations, "`caprl vocab`")

    @property
    def feat_dim(self) -> int:
        return int(self.features.dim)

    @property
    def n_regions(self) -> int:
        return int(self.features.n_regions)

    def split_ids(self, split: str) -> list[int]:
        return [int(i) for i in self.labels.image_ids(split)]

    def references(self, split: str) -> dict[int, list[list[str]]]:
        """Tokenised references (unclipped, no UNK) for rewards."""
        return references_from_annotations(self.annotations, split)

    def features_of(self, image_ids: list[int], regions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pooled, regions)``; ``regions=False``: an empty ``[B, 0, D]`` instead, not read."""
        return self.features.get(image_ids, regions=regions)

    def batch(self, image_ids: list[int], regions: bool = True) -> Batch:
        pooled, regions_ = self.features_of(image_ids, regions)
        rows, owner = [], []
        for k, image_id in enumerate(image_ids):
            caps = self.labels.captions(image_id)
            rows.append(torch.as_tensor(caps, dtype=torch.long))
            owner.extend([k] * len(caps))
        return Batch(
            image_ids=list(image_ids),
            pooled=pooled,
            regions=regions_,
            labels=torch.cat(rows, dim=0),
            label_image=torch.as_tensor(owner, dtype=torch.long),
        )

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        return [self.vocab.decode(row.tolist()) for row in tokens]
