"""Paper 003 (Shi et al.): actor-critic training of the policy and the value network (eq. 10-12).

Roles: ``model`` (the policy, started from an XE run), ``listener`` (the frozen visual-semantic
embedding that gives the reward, started from a ``listener`` run) and ``value`` (the value
network, started from a ``value`` run: :mod:`caprl.objectives.value`). Each step:

* ``n_samples`` captions per image are sampled in train mode with differentiable
  log-probabilities (the trainer's noise; the last stage of multi-stage models);
* each caption's reward R (eq. 6, the embedding reward, optionally mixed with ``cider_weight``
  of ``reward``) is computed without gradient;
* the value network gives v(s_t) for the state before every sampled word t;
* eq. 10: the advantage A_t = R - v(s_t) (a constant for the policy) weighs the policy's
  log-probabilities: policy loss = -mean over the sampled tokens of A_t log pi(w_t | s_t);
* eq. 11: value loss = mean over the same steps of (v(s_t) - R)^2 (the gradient of eq. 11 up
  to a factor 2); the total is their sum.

The value network reads token ids and the pooled features, never the policy's states, so the
value loss cannot move the policy, and the advantage is detached, so the policy loss cannot
move the value network. Both losses are averaged over the sampled tokens of the global batch
(as scst here); the paper's eq. 10 sums over t. The policy learns at ``lr``, the value network
at ``value_lr``, both x``lr_decay_rate`` every ``lr_decay_every`` epochs (sec. 4.1: 0.9 every two
epochs; the trainer's step decay); the embedding is frozen (no group, eval mode). The paper uses the
temporal-difference target only in name (eq. 10-12 are Monte-Carlo returns: R of the whole
caption); we implement the equations.

``value_hidden`` and ``value_mlp`` must equal those of the ``value`` run the value network
starts from (they size the network before its weights are loaded); a mismatch is a CaprlError
naming this run. Best epoch: validation CIDEr-D (greedy), as every captioner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from caprl import decoding
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, register_objective
from caprl.objectives.value import EmbeddingRewardObjective, ValueOptions


@dataclass
class ActorCriticOptions(ValueOptions):
    value_lr: float  # learning rate of the value network's optimiser group


def advantages(reward: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Eq. 10's A_t = R - v(s_t), ``[N, T]`` (``reward [N]``, ``values [N, T]``), detached."""
    return (reward.to(values.dtype).unsqueeze(1) - values).detach()


@register_objective("actor_critic")
class ActorCritic(EmbeddingRewardObjective):
    Options = ActorCriticOptions
    options: ActorCriticOptions

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.value.parameters()), "lr": self.options.value_lr, "name": "value"}]

    def parts(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(policy loss, value loss, statistics) of one batch: eq. 10 and eq. 11."""
        n = self.options.n_samples
        ctx = model.encode(batch.pooled, batch.regions)
        samples = decoding.sample(model, ctx, self.env.max_length, n=n, noise=batch.noise)
        tokens, mask, logprobs = samples.last_stage(), samples.mask[:, -1], samples.logprobs[:, -1]
        ids = [i for i in batch.image_ids for _ in range(n)]
        reward = self.rewards(ids, tokens, batch.pooled.repeat_interleave(n, dim=0))
        values = self.sampled_values(batch, tokens, n)
        advantage = advantages(reward, values)
        policy = -self.mean(advantage.to(logprobs.dtype) * logprobs, mask)
        value = self.value_mse(values, reward, mask)
        stats = {"policy_loss": float(policy.detach()), "value_mse": float(value.detach()),
                 "reward_sample": float(reward.mean()),
                 "advantage": float((advantage * mask).sum() / mask.sum().clamp(min=1.0))}
        return policy, value, stats

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        policy, value, stats = self.parts(model, batch)
        return policy + value, stats
