"""Coarse-to-fine RL (Stack-Cap, eq. 11-15): every fine stage's sample, normalised twice.

One greedy pass (eval mode, no gradient) and one sampling pass (train mode) decode every
stage at once, each stage reading its own previous word. For fine stage i = 1..Nf and
sample j of an image the relative reward is (eq. 15)

    dr_i = [r(sample_i) - r(greedy_i)] + [r(sample_i) - r(sample_{i-1})]

where ``sample_{i-1}`` is the preceding stage's sample from the same row of the sampling
pass (``sample_0`` = the coarse stage's sample). The loss (eq. 14) is

    L = - sum_{i=1..Nf} mean_tokens( dr_i * log p_{theta_0:i}(sample_i,t) )

(the mean over stage i's sampled tokens of the global batch, ``Objective.mean``; sampling
uses the batch's DDP-consistent noise when the trainer gives one).

The coarse stage has no RL term of its own; its LSTM still gets gradients through the
fine stages that read its hidden states (only its output layer gets none). Note that the
coarse LSTM reads ``h^{Nf}_{t-1}`` (eq. 2), so ``sample_{i-1}`` is not independent of
``sample_i``'s earlier words: the second baseline is the paper's, not an unbiased one.
"""

from __future__ import annotations

import numpy as np
import torch

from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, register_objective
from caprl.objectives.scst import SamplingOptions


def c2f_advantages(r_sample: np.ndarray, r_greedy: np.ndarray) -> np.ndarray:
    """Eq. 15 for every fine stage: ``[S, N]`` rewards -> ``[S-1, N]`` relative rewards.

    Row s of the inputs is stage s (0 = coarse); column j is one sample with, in
    ``r_greedy``, the greedy reward of the same image. Row 0 of ``r_greedy`` is not used.
    """
    r_sample, r_greedy = np.asarray(r_sample, dtype=np.float64), np.asarray(r_greedy, dtype=np.float64)
    if r_sample.shape != r_greedy.shape or r_sample.ndim != 2 or r_sample.shape[0] < 2:
        raise ValueError(f"expected two [S >= 2, N] arrays, got {r_sample.shape} and {r_greedy.shape}")
    return (r_sample[1:] - r_greedy[1:]) + (r_sample[1:] - r_sample[:-1])


@register_objective("c2f")
class CoarseToFineRL(Objective):
    Options = SamplingOptions  # SCST's sampling options: n_samples, reward, temperature
    options: SamplingOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        stages = model.n_stages
        if stages < 2:
            raise CaprlError(f"objective c2f needs a multi-stage model (coarse + fine stages); "
                             f"{type(model).__name__} has {stages} stage")
        n = self.options.n_samples
        reward = self.env.reward(self.options.reward)
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature)
        ids = batch.image_ids
        sample_ids = [i for i in ids for _ in range(n)]
        r_greedy = np.stack([reward(ids, self.env.decode_words(greedy.tokens[:, s])) for s in range(stages)])
        r_sample = np.stack([reward(sample_ids, self.env.decode_words(samples.tokens[:, s])) for s in range(stages)])
        advantage = self.tensor(c2f_advantages(r_sample, np.repeat(r_greedy, n, axis=1)), like=samples.logprobs)
        loss = -torch.stack([
            self.mean(advantage[s - 1].unsqueeze(1) * samples.logprobs[:, s], samples.mask[:, s])
            for s in range(1, stages)
        ]).sum()
        metrics = {"reward_sample": float(r_sample[-1].mean()), "reward_greedy": float(r_greedy[-1].mean())}
        for s in range(stages):
            metrics[f"reward_sample_stage{s}"] = float(r_sample[s].mean())
            metrics[f"reward_greedy_stage{s}"] = float(r_greedy[s].mean())
        return loss, metrics
