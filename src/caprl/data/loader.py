"""What the trainer and the evaluator read: labels, vocabulary, features, references.

A thin adapter over the data, features and rewards packages, so the training loop sees one
object with batch-level methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from caprl.data.annotations import load_annotations
from caprl.data.vocab import Labels, Vocab
from caprl.features.store import Features
from caprl.data.batch import Batch
from caprl.data.annotations import references_from_annotations


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
    def from_args(cls, args: Any) -> "CaptionData":
        return cls(DataPaths(args.annotations, args.vocab, args.labels, args.features))

    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths
        self.vocab = Vocab.load(paths.vocab)
        self.labels = Labels(paths.labels)
        self.features = Features(paths.features)
        self.annotations: dict[str, Any] = load_annotations(paths.annotations)

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

    def features_of(self, image_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        pooled, regions = self.features.get(image_ids)
        return torch.as_tensor(pooled, dtype=torch.float32), torch.as_tensor(regions, dtype=torch.float32)

    def batch(self, image_ids: list[int]) -> Batch:
        pooled, regions = self.features_of(image_ids)
        rows, owner = [], []
        for k, image_id in enumerate(image_ids):
            caps = self.labels.captions(image_id)
            rows.append(torch.as_tensor(caps, dtype=torch.long))
            owner.extend([k] * len(caps))
        return Batch(
            image_ids=list(image_ids),
            pooled=pooled,
            regions=regions,
            labels=torch.cat(rows, dim=0),
            label_image=torch.as_tensor(owner, dtype=torch.long),
        )

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        return [self.vocab.decode(row.tolist()) for row in tokens]
