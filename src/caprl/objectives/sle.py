"""Sequence-level exploration (paper 002, SLL-SLE; eq. 15-16): precision plus caption diversity.

For the ``s`` samples ``y_1..y_s`` of one image, sample ``j``'s surrogate loss (eq. 16) is::

    L_j = -alpha * Delta(y_j, y_i) * log p(y_j)  -  (1 - alpha) * (2/s) * sum_k d(y_j, y_k) * log p(y_j)

and the loss is their mean (eq. 15). As the paper does (sec. 5.1):

* Delta = CIDEr-D (``reward``), baselined by the CIDEr-D of the image's greedy caption;
* d(y, y') = 2 - (BLEU-3 + BLEU-4) of y with y' as its only reference (pycocoevalcap's
  sentence BLEU, computed in-process by :func:`caprl.rewards.pairwise_bleu`, batched over
  the whole batch), and d(y, y) = 0;
* the diversity baseline is b = (1/s^2) sum_j sum_k d(y_j, y_k), the mean pairwise distance.

Where the paper is silent, our choices: the paper calls BLEU-3 + BLEU-4 the distance; as
BLEU is a similarity we take 2 minus it (a constant shift, which the baseline cancels
except on the diagonal, where d = 0 as a distance must be). The baseline is subtracted
from every pairwise distance inside the sum, so the diversity weights of an image's
samples sum to zero: (2/s) sum_k (d_jk - b). BLEU is asymmetric (y_j is the candidate,
y_k the reference); we use it as it comes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, register_objective
from caprl.objectives.scst import SamplingOptions
from caprl.rewards import pairwise_bleu


@dataclass
class ExplorationOptions(SamplingOptions):
    alpha: float  # weight of the precision term; 1 - alpha on the diversity term


def pairwise_distances(groups: Sequence[Sequence[Sequence[str]]]) -> np.ndarray:
    """``[G, s, s]``: d(y_j, y_k) = 2 - (BLEU-3 + BLEU-4) within each group, 0 on the diagonal."""
    bleu = np.stack(pairwise_bleu(groups))  # [G, s, s, 4], NaN on the diagonal
    distance = 2.0 - bleu[..., 2] - bleu[..., 3]
    s = distance.shape[1]
    distance[:, np.arange(s), np.arange(s)] = 0.0
    return distance


def diversity_weights(distance: np.ndarray) -> np.ndarray:
    """``[G, s]``: eq. 16's diversity factor with the paper's baseline, (2/s) sum_k (d_jk - b),
    b = the mean of the group's s x s distances (diagonal zeros included)."""
    s = distance.shape[1]
    baseline = distance.mean(axis=(1, 2), keepdims=True)
    return (2.0 / s) * (distance - baseline).sum(axis=2)


def sample_weights(precision: np.ndarray, greedy: np.ndarray, distance: np.ndarray, alpha: float) -> np.ndarray:
    """``[G, s]``: the factor of -log p(y_j) in eq. 16 with both baselines: alpha times
    (Delta(y_j) - Delta(greedy)) plus (1 - alpha) times the diversity weight."""
    return alpha * (precision - greedy[:, None]) + (1.0 - alpha) * diversity_weights(distance)


@register_objective("sll_sle")
class SequenceLevelExploration(Objective):
    Options = ExplorationOptions
    options: ExplorationOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.options.n_samples
        reward = self.env.reward(self.options.reward)
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature)
        ids = batch.image_ids
        words = self.env.decode_words(samples.last_stage())
        r_greedy = reward(ids, self.env.decode_words(greedy.last_stage()))
        r_sample = reward([i for i in ids for _ in range(n)], words).reshape(len(ids), n)
        distance = pairwise_distances([words[g * n:(g + 1) * n] for g in range(len(ids))])
        weights = sample_weights(r_sample, r_greedy, distance, self.options.alpha)
        weight = self.tensor(weights.reshape(-1), like=samples.logprobs)
        loss = -self.mean(weight.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
        off_diagonal = distance.sum(axis=(1, 2)) / max(n * (n - 1), 1)
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean()),
                      "distance": float(off_diagonal.mean())}
