"""Cross-entropy with teacher forcing; for multi-stage models the sum of the stages' losses (Stack-Cap eq. 10).

Scheduled sampling (off in the demo, ``ss_start: -1``) follows self-critical.pytorch's
``scheduled_sampling_*`` options (train.py): from epoch ``ss_start`` on (after it, as there),
the probability of feeding a sampled word is ``ss_increase_prob`` per ``ss_increase_every``
epochs, at most ``ss_max_prob``; the samples are drawn from a generator seeded by the run's
seed and the step, so a resumed run draws the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from caprl.models.base import CaptionModel, map_batch
from caprl.objectives.base import Batch, Objective, Options, register_objective


def token_mask(labels: torch.Tensor) -> torch.Tensor:
    """``[M, T+1]``: the caption's words plus its end token."""
    lengths = (labels > 0).sum(dim=1)
    positions = torch.arange(labels.shape[1] + 1, device=labels.device)
    return (positions.unsqueeze(0) <= lengths.unsqueeze(1)).float()


def gold_targets(labels: torch.Tensor) -> torch.Tensor:
    return torch.cat([labels, labels.new_zeros(labels.shape[0], 1)], dim=1)


@dataclass
class XEOptions(Options):
    ss_start: int = -1  # epoch after which scheduled sampling starts (-1: never; SCP scheduled_sampling_start)
    ss_increase_every: int = 5  # epochs per increase of the sampling probability
    ss_increase_prob: float = 0.05  # its increase
    ss_max_prob: float = 0.25  # its ceiling


def sampling_probability(epoch: int, options: XEOptions) -> float:
    """Scheduled sampling's probability in (0-based) ``epoch``: 0 up to ``ss_start``, then
    ``ss_increase_prob`` per ``ss_increase_every`` epochs since, at most ``ss_max_prob``."""
    if options.ss_start < 0 or epoch <= options.ss_start:
        return 0.0
    steps = (epoch - options.ss_start) // max(1, options.ss_increase_every)
    return min(options.ss_increase_prob * steps, options.ss_max_prob)


@register_objective("xe")
class CrossEntropy(Objective):
    Options = XEOptions
    options: XEOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        step = batch.noise.step if batch.noise is not None else 0
        prob = self._sampling(batch)
        generator = None
        if prob > 0:
            seed = batch.noise.seed if batch.noise is not None else 0
            generator = torch.Generator(device=batch.labels.device).manual_seed(hash((seed, step, 7919)) % 2**63)
        per_stage = self._stage_means(model, batch, lambda ctx: model.token_logprobs(ctx, batch.labels, prob, generator))
        metrics: dict[str, float] = {k: float(v) for k, v in self._metrics(per_stage).items()}
        if prob > 0:
            metrics["ss_prob"] = prob
        return per_stage.sum(), metrics

    def _stage_means(self, model: CaptionModel, batch: Batch,
                     logprobs: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        """Each stage's mean NLL of the gold words; ``logprobs(ctx)`` gives their ``[M, S, T+1]``
        log-probabilities. Each image is encoded once, then one row per gold caption (5x less
        encoder work on COCO)."""
        ctx = map_batch(lambda t: t.index_select(0, batch.label_image), model.encode(batch.pooled, batch.regions))
        nll = -logprobs(ctx)
        mask = token_mask(batch.labels)
        return torch.stack([self.mean(nll[:, s], mask) for s in range(nll.shape[1])])

    @staticmethod
    def _metrics(per_stage: torch.Tensor) -> dict[str, torch.Tensor]:
        values = per_stage.detach()
        metrics = {f"xe_stage{s}": v for s, v in enumerate(values)} if len(values) > 1 else {}
        metrics["xe"] = values[-1]
        return metrics

    def _sampling(self, batch: Batch) -> float:
        step = batch.noise.step if batch.noise is not None else 0
        return sampling_probability(step // max(1, int(self.env.extras.get("steps_per_epoch", 1))), self.options)

    def fixed_step(self, batch: Batch) -> bool:
        return self._sampling(batch) == 0  # scheduled sampling draws its words step by step

    def fixed_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`loss` without scheduled sampling, every row run to the full length (a CUDA graph
        captures the whole step: :mod:`caprl.training.graphs`); the metrics stay tensors."""
        per_stage = self._stage_means(model, batch, lambda ctx: model.token_logprobs_fixed(ctx, batch.labels))
        return per_stage.sum(), self._metrics(per_stage)
