"""Group-relative policy optimisation (GRPO; Shao et al. 2024, DeepSeekMath, arXiv 2402.03300
sec. 4.1), as TRL implements it (huggingface/trl ``trl/trainer/grpo_trainer.py``,
``GRPOTrainer._generate_and_score_completions`` and ``_compute_loss``; options of ``grpo_config.py``).

Each image gets G = ``n_samples`` sampled captions, scored by ``reward`` (a name under
``rewards:``). Advantage of caption i: A_i = r_i - mean(r of its group), divided by the group's
standard deviation (``scale_rewards: group``, the paper's eq. of sec. 4.1.2 and TRL's default),
by the whole batch's (``batch``) or by nothing (``none``; with ``loss_type: dr_grpo`` this is
Dr. GRPO, Liu et al. 2025, arXiv 2503.20783); the deviation is torch's (Bessel-corrected) plus
1e-4, TRL's. Per token t of caption i, with ratio rho = pi(o_t) / pi_old(o_t):

    l_{i,t} = -min(rho A_i, clip(rho, 1 - epsilon, 1 + epsilon_high) A_i) + beta * KL_k3(pi || pi_ref)

pi_old is the policy that sampled the batch; the batch is used for ``num_iterations`` optimiser
updates (TRL's name; the paper's mu), the first with rho exactly 1 (the sampling's own
log-probabilities), the later ones re-scoring the same captions under the updated policy (train
mode: fresh dropout masks, as TRL re-computes log-probabilities with the model in train mode).
KL_k3 (:func:`caprl.objectives.policy.k3`, the paper's eq. 4) is to the frozen XE start
(:mod:`caprl.objectives.policy`; only held where ``beta`` > 0, as TRL loads a reference model only
then). Aggregation ``loss_type`` (:data:`AGGREGATIONS`, TRL's): ``grpo`` (the paper's eq. 3: each
caption's token mean, then the mean over captions), ``bnpo`` (one mean over every token of the
batch), ``dr_grpo`` (the sum over tokens divided by the number of captions times ``max_length``).
With DDP every mean is over the global batch.

Captioning values (params.yaml): Liang 2025 (arXiv 2503.01333, "GRPO for image captioning"):
G = 5, CIDEr-D reward, beta 0.04, epsilon 0.2, 2 updates per batch. The samples are drawn at
temperature 1 (TRL's default; no option: re-scoring would have to divide by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from caprl.data.batch import Batch
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import ObjectiveEnv, Options, one_of, register_objective
from caprl.objectives.policy import REFERENCE_ROLE, MultiPass, Rollout, k3, reference_logprobs, single_stage
from caprl.registry import Registry

STD_EPS = 1e-4  # TRL's: advantages / (std + 1e-4)

#: scale_rewards: what each advantage is divided by, ``(rewards [B, G], global std of all) -> [B, 1] or scalar``
SCALES: Registry[Callable[[torch.Tensor, Callable[[], torch.Tensor]], torch.Tensor]] = Registry("reward scale")
SCALES.add("group", lambda r, _batch_std: r.std(dim=1, keepdim=True) + STD_EPS)
SCALES.add("batch", lambda _r, batch_std: batch_std() + STD_EPS)
SCALES.add("none", lambda r, _batch_std: torch.ones((), dtype=r.dtype, device=r.device))


@dataclass
class GRPOOptions(Options):
    n_samples: int  # G, captions per image
    reward: str  # a name under rewards:
    scale_rewards: str = one_of(lambda: SCALES)  # group | batch | none
    loss_type: str = one_of(lambda: AGGREGATIONS)  # grpo | bnpo | dr_grpo
    epsilon: float  # the ratio's lower clip: 1 - epsilon
    epsilon_high: float  # its upper clip: 1 + epsilon_high (TRL: epsilon_high = epsilon unless set)
    num_iterations: int  # optimiser updates per batch of samples (the paper's mu)
    beta: float  # the KL term's weight (0: no reference model)
    #: SCP's remove_bad_endings while sampling (Objective.sampling_rule); one pass only (the later passes re-score
    #: the captions under the unconstrained policy, which is not the one that sampled them)
    remove_bad_endings: bool = field(default=False, kw_only=True)

    def check(self, where: str) -> None:
        super().check(where)
        if self.n_samples < 2:
            raise CaprlError(f"{where}.n_samples: GRPO's advantage compares an image's captions with each other: "
                             f"needs >= 2, got {self.n_samples}")
        if not 0 < self.epsilon < 1 or self.epsilon_high <= 0:
            raise CaprlError(f"{where}.epsilon / epsilon_high: expected 0 < epsilon < 1 and epsilon_high > 0, got "
                             f"{self.epsilon} / {self.epsilon_high}")
        if self.remove_bad_endings and self.num_iterations > 1:
            raise CaprlError(f"{where}.remove_bad_endings: with num_iterations {self.num_iterations} the later passes "
                             "re-score the captions under the unconstrained policy, not the one that sampled them: "
                             "set num_iterations 1 or remove_bad_endings false")
        if self.num_iterations < 1 or self.beta < 0:
            raise CaprlError(f"{where}: expected num_iterations >= 1 and beta >= 0, got {self.num_iterations} and "
                             f"{self.beta}")


def group_advantages(rewards: torch.Tensor, n: int, scale: str,
                     global_sum: Callable[[torch.Tensor], torch.Tensor] = lambda x: x) -> torch.Tensor:
    """``[B * G]`` rewards (image-major) -> advantages: minus the group mean, over ``scale``
    (:data:`SCALES`); ``batch``'s deviation is over every process's rewards (``global_sum``)."""
    per_image = rewards.reshape(-1, n)

    def batch_std() -> torch.Tensor:
        total, count = global_sum(rewards.sum()), global_sum(rewards.new_tensor(float(rewards.numel())))
        squares = global_sum(((rewards - total / count) ** 2).sum())
        return (squares / (count - 1).clamp(min=1)).sqrt()

    centred = per_image - per_image.mean(dim=1, keepdim=True)
    return (centred / SCALES.get(scale, where="scale_rewards")(per_image, batch_std)).reshape(-1)


Aggregate = Callable[["GRPO", torch.Tensor, torch.Tensor], torch.Tensor]
#: loss_type: per-token losses ``[N, T]`` and their mask -> the loss (TRL grpo_trainer.py ``_compute_loss``)
AGGREGATIONS: Registry[Aggregate] = Registry("GRPO loss aggregation")


def _per_caption(self: "GRPO", losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_caption = (losses * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    count = self.env.global_sum(per_caption.new_tensor(float(per_caption.shape[0])))
    return per_caption.sum() * self.env.world_size / count


def _dr_grpo(self: "GRPO", losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    count = self.env.global_sum(losses.new_tensor(float(losses.shape[0])))
    return (losses * mask).sum() * self.env.world_size / (count * self.env.max_length)


AGGREGATIONS.add("grpo", _per_caption)
AGGREGATIONS.add("bnpo", lambda self, losses, mask: self.mean(losses, mask))
AGGREGATIONS.add("dr_grpo", _dr_grpo)


@register_objective("grpo")
class GRPO(MultiPass):
    Options = GRPOOptions
    options: GRPOOptions

    def __init__(self, options: Options, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        single_stage(model, "grpo")
        self.set_passes(self.options.num_iterations)
        if self.options.beta > 0:  # TRL loads a reference model only then
            self.hold_reference(model)

    def rollout(self, model: CaptionModel, batch: Batch) -> Rollout:
        n = self.options.n_samples
        _, samples = self.greedy_and_samples(model, batch, n, greedy=False)
        tokens = samples.last_stage()
        rewards = np.asarray(self.env.reward(self.options.reward)([i for i in batch.image_ids for _ in range(n)],
                                                                 self.env.decode_words(tokens)))
        advantages = group_advantages(self.tensor(rewards, like=samples.logprobs), n, self.options.scale_rewards,
                                      self.env.global_sum)
        extra = {"advantages": advantages, "reward_sample": float(rewards.mean())}
        if self.options.beta > 0:
            extra["ref_logprobs"] = reference_logprobs(getattr(self, REFERENCE_ROLE), batch, tokens, n)
        return Rollout(batch, samples, samples.logprobs[:, -1].detach(), samples.mask[:, -1], extra)

    def pass_loss(self, rollout: Rollout, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        o = self.options
        advantage = rollout.extra["advantages"].unsqueeze(1)
        ratio = torch.exp(logprobs - rollout.old_logprobs)
        clipped = torch.clamp(ratio, 1 - o.epsilon, 1 + o.epsilon_high)
        losses = -torch.min(ratio * advantage, clipped * advantage)
        mask = rollout.mask
        stats = {"reward_sample": rollout.extra["reward_sample"]}
        if o.beta > 0:
            kl = k3(logprobs, rollout.extra["ref_logprobs"])
            losses = losses + o.beta * kl
            stats["kl"] = float(self.mean(kl.detach(), mask))
        stats["clip_ratio"] = float(self.mean((ratio.detach() != clipped.detach()).to(mask.dtype), mask))
        return AGGREGATIONS.get(o.loss_type, where="loss_type")(self, losses, mask), stats
