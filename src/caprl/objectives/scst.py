"""Self-critical sequence training (Rennie et al. 2017): REINFORCE with the greedy caption as baseline.

Each image gets ``n_samples`` samples; every sample's advantage is its reward minus the
reward of the same image's greedy caption. Multi-stage models are trained on their last stage.
"""

from __future__ import annotations

import torch

from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, register_objective


@register_objective("scst")
class SelfCritical(Objective):
    option_names = ("n_samples", "reward", "temperature")

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = int(self.options.get("n_samples", 1))
        reward = self.env.reward(self.options.get("reward", "cider_d"))
        greedy, samples = self.greedy_and_samples(model, batch, n)
        ids = batch.image_ids
        r_greedy = reward(ids, self.env.decode_words(greedy.last_stage()))
        r_sample = reward([i for i in ids for _ in range(n)], self.env.decode_words(samples.last_stage()))
        advantage = torch.as_tensor(r_sample - r_greedy.repeat(n), dtype=samples.logprobs.dtype)
        loss = -self.mean(advantage.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean())}
