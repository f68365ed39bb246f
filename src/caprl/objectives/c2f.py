"""Coarse-to-fine RL (Stack-Cap, eq. 11-15): every fine stage's sample, normalised twice.

One sampling pass (train mode) and one greedy pass (no gradient; option ``greedy_mode``,
params.yaml: ``train``, dropout on, as the authors' Stack-Captioning misc/rewards.py
``get_self_critical_reward`` calls ``model.sample`` with no ``.eval()``) decode every stage at
once, each stage reading its own previous word. For fine stage i = 1..Nf and
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

Option ``baseline`` (:data:`caprl.objectives.baselines.BASELINES`) replaces the first term's
r(greedy_i) (the paper's, ``greedy``); ``nsc`` takes, per stage, the mean reward of the
image's other samples at that stage and decodes no greedy captions.
"""

from __future__ import annotations

import numpy as np
import torch

from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, register_objective
from caprl.objectives.baselines import BASELINES
from caprl.objectives.scst import SamplingOptions


def c2f_advantages(r_sample: np.ndarray, r_greedy: np.ndarray) -> np.ndarray:
    """Eq. 15 for every fine stage: ``[S, N]`` rewards -> ``[S-1, N]`` relative rewards.

    Row s of the inputs is stage s (0 = coarse); column j is one sample with, in
    ``r_greedy``, its baseline (the paper: the greedy reward of the same image). Row 0 of
    ``r_greedy`` is not used.
    """
    r_sample, r_greedy = np.asarray(r_sample, dtype=np.float64), np.asarray(r_greedy, dtype=np.float64)
    if r_sample.shape != r_greedy.shape or r_sample.ndim != 2 or r_sample.shape[0] < 2:
        raise ValueError(f"expected two [S >= 2, N] arrays, got {r_sample.shape} and {r_greedy.shape}")
    return relative_rewards(r_sample, r_sample - r_greedy)


def relative_rewards(r_sample: np.ndarray, advantage: np.ndarray) -> np.ndarray:
    """Eq. 15 from its first term: ``[S, N]`` rewards and ``advantage`` (each reward minus its
    baseline) -> ``[S-1, N]``: ``advantage_i + (r(sample_i) - r(sample_{i-1}))``."""
    return advantage[1:] + (r_sample[1:] - r_sample[:-1])


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
        reward, baseline = self.env.reward(self.options.reward), BASELINES[self.options.baseline]
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature, greedy=baseline.greedy)
        ids = batch.image_ids
        sample_ids = [i for i in ids for _ in range(n)]
        r_greedy = None if greedy is None else np.asarray(np.stack(
            [reward(ids, self.env.decode_words(greedy.tokens[:, s])) for s in range(stages)]), dtype=np.float64)
        r_sample = np.asarray(np.stack([reward(sample_ids, self.env.decode_words(samples.tokens[:, s]))
                                        for s in range(stages)]), dtype=np.float64)
        first = np.stack([baseline.advantage(r_sample[s], None if r_greedy is None else r_greedy[s], n)
                          for s in range(stages)])  # r(sample_i) - its baseline (the paper: r(greedy_i))
        advantage = self.tensor(relative_rewards(r_sample, first), like=samples.logprobs)
        loss = -torch.stack([
            self.mean(advantage[s - 1].unsqueeze(1) * samples.logprobs[:, s], samples.mask[:, s])
            for s in range(1, stages)
        ]).sum()
        metrics = {"reward_sample": float(r_sample[-1].mean())}
        if r_greedy is not None:
            metrics["reward_greedy"] = float(r_greedy[-1].mean())
        for s in range(stages):
            metrics[f"reward_sample_stage{s}"] = float(r_sample[s].mean())
            if r_greedy is not None:
                metrics[f"reward_greedy_stage{s}"] = float(r_greedy[s].mean())
        return loss, metrics
