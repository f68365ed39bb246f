"""PPO with a per-token KL penalty to the frozen XE policy in the reward (Ziegler et al. 2019,
arXiv 1909.08593; Stiennon et al. 2020, arXiv 2009.01325), as openai/lm-human-preferences runs it
(``lm_human_preferences/train_policy.py``: ``PPOTrainer.__init__``'s ``compute_rewards``,
``PPOTrainer.step``, ``PPOTrainer.loss``, ``FixedKLController``, ``AdaptiveKLController``; its
``utils/core.py`` ``whiten``; the value head of ``language/model.py`` ``Model.__call__``).

Each image gets ``n_samples`` captions (train mode), scored by ``reward`` (a name under
``rewards:``). Per token t of caption i, with k1 = log pi_old - log pi_ref (the sampling policy's
against the frozen XE start, :mod:`caprl.objectives.policy`)::

    r_{i,t} = -kl_coef * k1_{i,t}   (+ the caption's reward at its last token, the end token)

The rewards are whitened without their mean shifted (``whiten_rewards``), then GAE (``gamma``,
``lam``; the reference's 1 and 0.95) on the values V_t of the sampling pass gives the advantages;
returns = advantages + V; the advantages are whitened. Loss, with rho = pi / pi_old::

    max(-A rho, -A clip(rho, 1 +- cliprange)) + vf_coef * 0.5 max((v - R)^2, (clip(v, V +- cliprange_value) - R)^2)

``noptepochs`` optimiser updates per batch (:class:`~caprl.objectives.policy.MultiPass`): the
first with the sampling's own log-probabilities and values, the later ones re-scoring the same
captions (:func:`rescore`, train mode). The KL coefficient is a controller (:data:`KL_CONTROLLERS`,
by :func:`controller_name`): ``kl_target`` 0 the reference's default ``fixed`` (its ``adaptive_kl``
None), else ``adaptive`` (x(1 + clip(KL / kl_target - 1, +-0.2) * n / kl_horizon), KL the batch's
mean per-caption sum of k1, n its number of captions), updated once per batch after its rewards
(the reference: after the batch's updates, with the same numbers), in a checkpointed buffer.

The value head (role ``value_head``) is a linear map of the decoder state the sampling read
(``Samples.hidden``; the output layer's input but for softatt), zero-initialised as the
reference's (``fc_layer(..., scale=0)``); like the reference's, which shares the transformer's
trunk, the value loss also reaches the captioner's decoder through that state. One Adam for
both: the value head's group at ``lr``.

Where ours differs: one minibatch per batch (``nminibatches`` 1, no shuffle); captions end at
their end token, so every mean and the whitening are over the caption tokens (masked) of the
GLOBAL (DDP) batch, and the caption reward is at the end token rather than at a fixed last
column; the rewards are the captioning metrics of ``env.reward``, not a learnt reward model;
the samples are drawn with dropout (train mode, as every caprl RL method) and at temperature 1;
no dropout before the value head; the learning rate follows caprl's schedule (the reference
anneals it linearly to 0) and Adam's epsilon is ``adam_eps`` (the reference's 1e-5); the
trainer clips gradients per group (the reference does not clip).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from caprl import decoding
from caprl.data.batch import Batch
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import ObjectiveEnv, Options, register_objective
from caprl.objectives.policy import MultiPass, Rollout, k1, reference_logprobs, single_stage
from caprl.registry import Registry

VALUE_ROLE = "value_head"
CONTROLLER_ROLE = "kl_controller"
WHITEN_EPS = 1e-8  # utils/core.py whiten: rsqrt(var + 1e-8)
ERROR_CLIP = 0.2  # AdaptiveKLController.update: proportional error clipped to [-0.2, 0.2]
GlobalSum = Callable[[torch.Tensor], torch.Tensor]


class KLController(nn.Module):
    """``FixedKLController``: the coefficient (a buffer, so checkpointed and resumed) never moves."""

    def __init__(self, kl_coef: float, target: float, horizon: int) -> None:
        super().__init__()
        self.register_buffer("kl_coef", torch.tensor(kl_coef, dtype=torch.float64))
        self.target, self.horizon = target, horizon

    @property
    def value(self) -> float:
        return float(self.kl_coef)

    def update(self, current: float, n_steps: float) -> None:
        pass


class AdaptiveKLController(KLController):
    """``AdaptiveKLController.update``: coef x (1 + clip(current / target - 1, +-0.2) * n_steps / horizon)."""

    def update(self, current: float, n_steps: float) -> None:
        error = float(np.clip(current / self.target - 1, -ERROR_CLIP, ERROR_CLIP))
        self.kl_coef.mul_(1 + error * n_steps / self.horizon)


KL_CONTROLLERS: Registry[type[KLController]] = Registry("KL controller")
KL_CONTROLLERS.add("fixed", KLController)
KL_CONTROLLERS.add("adaptive", AdaptiveKLController)


def controller_name(target: float) -> str:
    """The controller option ``kl_target`` asks for: 0 (the reference's ``adaptive_kl`` None) fixed."""
    return "adaptive" if target > 0 else "fixed"


@dataclass
class PPOKLOptions(Options):
    n_samples: int  # captions per image
    reward: str  # a name under rewards:
    kl_coef: float  # the KL penalty's (starting) coefficient
    kl_target: float  # the per-caption KL the adaptive controller steers to (0: a fixed kl_coef)
    kl_horizon: int  # adaptive: in captions
    noptepochs: int  # optimiser updates per batch of samples
    cliprange: float
    cliprange_value: float
    vf_coef: float
    gamma: float
    lam: float  # GAE's lambda
    whiten_rewards: bool

    def check(self, where: str) -> None:
        super().check(where)
        positive = {"n_samples": self.n_samples, "noptepochs": self.noptepochs, "kl_horizon": self.kl_horizon,
                    "cliprange": self.cliprange, "cliprange_value": self.cliprange_value}
        for key, value in positive.items():
            if value <= 0:
                raise CaprlError(f"{where}.{key}: expected a positive number, got {value!r}")
        for key, value in {"kl_coef": self.kl_coef, "kl_target": self.kl_target, "vf_coef": self.vf_coef}.items():
            if value < 0:
                raise CaprlError(f"{where}.{key}: expected a number >= 0, got {value!r}")
        for key, value in {"gamma": self.gamma, "lam": self.lam}.items():
            if not 0 <= value <= 1:
                raise CaprlError(f"{where}.{key}: expected a number in [0, 1], got {value!r}")


def kl_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """``compute_rewards``: ``[N, T]`` per-token rewards -kl_coef * kl, plus ``scores [N]`` at each
    caption's last token (``mask [N, T]``: its words, end token included)."""
    rewards = -kl_coef * kl * mask
    last = mask.sum(1).long() - 1
    return rewards.index_put((torch.arange(len(last), device=last.device), last), scores.to(rewards.dtype),
                             accumulate=True)


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           global_sum: GlobalSum = lambda x: x) -> torch.Tensor:
    """``utils/core.py whiten`` over the masked entries of every process: (x - mean) / sqrt(var + 1e-8)
    (biased variance, tf.nn.moments'), the mean added back unless ``shift_mean``; 0 where masked."""
    count = global_sum(mask.sum()).clamp(min=1.0)
    mean = global_sum((values * mask).sum()) / count
    var = global_sum((((values - mean) * mask) ** 2).sum()) / count
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return (whitened if shift_mean else whitened + mean) * mask


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """``PPOTrainer.loss``'s GAE, ``[N, T]`` advantages (rewards and values 0 after each end)."""
    last = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        following = values[:, t + 1] if t + 1 < rewards.shape[1] else 0.0
        last = rewards[:, t] + gamma * following - values[:, t] + gamma * lam * last
        out.append(last)
    return torch.stack(out[::-1], dim=1)


def clipped_policy_losses(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
                          cliprange: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token max(-A rho, -A clip(rho, 1 +- cliprange)), and where the clipped term won."""
    ratio = torch.exp(logprobs - old)
    plain, clipped = -advantages * ratio, -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    return torch.max(plain, clipped), clipped > plain


def clipped_value_losses(vpred: torch.Tensor, old: torch.Tensor, returns: torch.Tensor,
                         cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token 0.5 max((v - R)^2, (clip(v, V +- c) - R)^2), and where the clipped term won."""
    plain = (vpred - returns) ** 2
    clipped = (torch.clamp(vpred, old - cliprange_value, old + cliprange_value) - returns) ** 2
    return 0.5 * torch.max(plain, clipped), clipped > plain


def rescore(model: CaptionModel, batch: Batch, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-force ``tokens [N, T]`` (``n`` per image, image-major) through the decoder step by
    step, as sampling stepped it: each word's log-probability ``[N, T]`` and the decoder state
    read before it ``[N, T, H]`` (``core.hidden``, ``Samples.hidden``'s). Unmasked: multiply by the mask."""
    ctx = decoding.expand(model.encode(batch.pooled, batch.regions), n)
    state = model.init_state(ctx)
    prev = tokens.new_zeros(tokens.shape[0], 1)
    outs, hiddens = [], []
    for t in range(tokens.shape[1]):
        core = model.core(prev, ctx, state)
        state = core.state
        outs.append(core.out[:, -1])
        hiddens.append(core.hidden[:, -1])
        prev = tokens[:, t : t + 1]
    logprobs = torch.log_softmax(model.head(torch.stack(outs, dim=1)), dim=-1)  # [N, T, V]
    return logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), torch.stack(hiddens, dim=1)


def hidden_size(model: CaptionModel) -> int:
    """The width of the decoder state ``core.hidden`` (one eval-mode step on a blank image; no RNG)."""
    p = next(model.parameters())
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            ctx = model.encode(p.new_zeros(1, model.feat_dim), p.new_zeros(1, model.n_regions, model.feat_dim))
            at = decoding.start(model, ctx)
            return int(model.core(at.prev, at.ctx, at.state).hidden.shape[-1])
    finally:
        model.train(was)


class ValueHead(nn.Module):
    """A scalar value per decoder state, zero-initialised (``fc_layer(..., scale=0)``)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden).squeeze(-1)


@register_objective("ppo_kl")
class PPOKL(MultiPass):
    Options = PPOKLOptions
    options: PPOKLOptions
    holds = (VALUE_ROLE,)
    keeps = (CONTROLLER_ROLE,)  # and the reference (hold_reference)

    def __init__(self, options: Options, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        single_stage(model, "ppo_kl")
        o = self.options
        self.set_passes(o.noptepochs)
        self.value_head = ValueHead(hidden_size(model))
        self.hold_reference(model)
        controller = KL_CONTROLLERS.get(controller_name(o.kl_target), where="kl_target")
        self.kl_controller = controller(o.kl_coef, o.kl_target, o.kl_horizon)

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.value_head.parameters()), "lr": self.options.lr, "name": VALUE_ROLE}]

    def rollout(self, model: CaptionModel, batch: Batch) -> Rollout:
        o, n = self.options, self.options.n_samples
        model.train()
        ctx = model.encode(batch.pooled, batch.regions)
        samples = decoding.sample(model, ctx, self.env.max_length, n=n, noise=batch.noise, keep_hidden=True)
        tokens, mask = samples.last_stage(), samples.mask[:, -1]
        hidden = samples.hidden[:, -1]  # [N, T', H]: on a CPU the decode stops when every caption has ended
        hidden = F.pad(hidden, (0, 0, 0, tokens.shape[1] - hidden.shape[1]))
        vpred = self.value_head(hidden) * mask  # with gradient: pass 1's
        old_logprobs = samples.logprobs[:, -1].detach()
        scores = np.asarray(self.env.reward(o.reward)([i for i in batch.image_ids for _ in range(n)],
                                                      self.env.decode_words(tokens)))
        kl = k1(old_logprobs, reference_logprobs(self.reference, batch, tokens, n)) * mask
        kl_coef = self.kl_controller.value
        rewards = kl_rewards(self.tensor(scores, like=old_logprobs), kl, mask, kl_coef)
        if o.whiten_rewards:
            rewards = whiten(rewards, mask, shift_mean=False, global_sum=self.env.global_sum)
        values = vpred.detach()
        advantages = gae(rewards, values, o.gamma, o.lam) * mask
        returns = advantages + values
        captions = self.env.global_sum(kl.new_tensor(float(kl.shape[0])))
        mean_kl = float(self.env.global_sum(kl.sum()) / captions)  # objective/kl: per-caption sum, mean
        self.kl_controller.update(mean_kl, float(captions))  # PPOTrainer.step, once per batch
        extra = {"advantages": whiten(advantages, mask, global_sum=self.env.global_sum), "returns": returns,
                 "values": values, "vpred": vpred,
                 "stats": {"reward_sample": float(scores.mean()), "kl": mean_kl, "kl_coef": kl_coef,
                           "entropy": float(self.env.global_sum(-(old_logprobs * mask).sum()) / captions),
                           "returns": float(self.mean(returns, mask))}}
        return Rollout(batch, samples, old_logprobs, mask, extra)

    def sampled(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """Pass 1 reads the sampling's log-probabilities and values."""
        return rollout.samples.logprobs[:, -1], rollout.extra["vpred"]

    def rescored(self, model: CaptionModel, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """A later pass re-scores log-probabilities AND values (the value head on the re-scored states)."""
        logprobs, hidden = self.rescore(model, rollout.batch, rollout.samples.last_stage(), self._n(rollout))
        return logprobs, self.value_head(hidden) * rollout.mask

    def rescore(self, model: CaptionModel, batch: Batch, tokens: torch.Tensor,
                n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rescore(model, batch, tokens, n)

    def pass_loss(self, rollout: Rollout, current: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs, vpred = current
        return self.ppo_loss(rollout, logprobs * rollout.mask, vpred)

    def ppo_loss(self, rollout: Rollout, logprobs: torch.Tensor,
                 vpred: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``PPOTrainer.loss`` on one rollout, given the current policy's log-probabilities and values."""
        o, mask, extra = self.options, rollout.mask, rollout.extra
        pg, pg_clipped = clipped_policy_losses(logprobs, rollout.old_logprobs, extra["advantages"], o.cliprange)
        vf, vf_clipped = clipped_value_losses(vpred, extra["values"], extra["returns"], o.cliprange_value)
        pg_loss, vf_loss = self.mean(pg, mask), self.mean(vf, mask)
        approxkl = 0.5 * self.mean((logprobs.detach() - rollout.old_logprobs) ** 2, mask)
        stats = {**extra["stats"], "policy_loss": float(pg_loss.detach()), "value_loss": float(vf_loss.detach()),
                 "clip_ratio": float(self.mean(pg_clipped.to(mask.dtype), mask)),
                 "value_clip_ratio": float(self.mean(vf_clipped.to(mask.dtype), mask)),
                 "approxkl": float(approxkl)}
        return pg_loss + o.vf_coef * vf_loss, stats
