"""Self-critical sequence training (Rennie et al. 2017): REINFORCE with the greedy caption as baseline.

Each image gets ``n_samples`` samples; every sample's advantage is its reward minus the
reward of the same image's greedy caption. Multi-stage models are trained on their last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, Options, register_objective


@dataclass
class SelfCriticalOptions(Options):
    n_samples: int  # samples per image
    reward: str  # a name under `rewards:`
    temperature: float


@register_objective("scst")
class SelfCritical(Objective):
    Options = SelfCriticalOptions
    options: SelfCriticalOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.options.n_samples
        reward = self.env.reward(self.options.reward)
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature)
        ids = batch.image_ids
        r_greedy = reward(ids, self.env.decode_words(greedy.last_stage()))
        r_sample = reward([i for i in ids for _ in range(n)], self.env.decode_words(samples.last_stage()))
        advantage = self.tensor(r_sample - np.repeat(r_greedy, n), like=samples.logprobs)
        loss = -self.mean(advantage.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean())}
