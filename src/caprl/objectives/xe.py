"""Cross-entropy with teacher forcing; for multi-stage models the sum of the stages' losses (Stack-Cap eq. 10)."""

from __future__ import annotations

import torch

from caprl.models.base import CaptionModel, map_batch
from caprl.objectives.base import Batch, Objective, register_objective


def token_mask(labels: torch.Tensor) -> torch.Tensor:
    """``[M, T+1]``: the caption's words plus its end token."""
    lengths = (labels > 0).sum(dim=1)
    positions = torch.arange(labels.shape[1] + 1, device=labels.device)
    return (positions.unsqueeze(0) <= lengths.unsqueeze(1)).float()


def gold_targets(labels: torch.Tensor) -> torch.Tensor:
    return torch.cat([labels, labels.new_zeros(labels.shape[0], 1)], dim=1)


@register_objective("xe")
class CrossEntropy(Objective):
    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        # encode each image once, then one row per gold caption (5x less encoder work on COCO)
        ctx = map_batch(lambda t: t.index_select(0, batch.label_image), model.encode(batch.pooled, batch.regions))
        nll = -model.token_logprobs(ctx, batch.labels)  # [M, S, T+1]
        mask = token_mask(batch.labels)
        per_stage = torch.stack([self.mean(nll[:, s], mask) for s in range(nll.shape[1])])
        metrics = {f"xe_stage{s}": float(v) for s, v in enumerate(per_stage.detach())} if len(per_stage) > 1 else {}
        metrics["xe"] = float(per_stage[-1].detach())
        return per_stage.sum(), metrics
