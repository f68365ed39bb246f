"""The training batch type: what the data layer hands to an objective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Batch:
    """One training batch: ``image_ids [B]``, features, and gold captions.

    ``labels [M, T]`` holds every gold caption of the batch's images; ``label_image [M]``
    is the row (0..B-1) of the image each caption belongs to. ``noise`` is the step's
    sampling noise (``caprl.decoding.Noise``), set by the trainer.
    """

    image_ids: list[int]
    pooled: torch.Tensor
    regions: torch.Tensor
    labels: torch.Tensor
    label_image: torch.Tensor
    noise: Any = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(self.image_ids, *(t.to(device, non_blocking=non_blocking) for t in self._tensors()), self.noise)

    def pin(self) -> "Batch":
        """In page-locked memory, for an asynchronous copy to a GPU."""
        return Batch(self.image_ids, *(t.pin_memory() for t in self._tensors()), self.noise)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.pooled, self.regions, self.labels, self.label_image)
