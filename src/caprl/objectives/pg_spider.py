"""PG-SPIDEr (Liu et al., ICCV 2017): policy gradient with Monte-Carlo roll-outs and a learned baseline.

For each image ``n_samples`` captions ``g_{1:T}`` are sampled (the paper's M: "a value of M = 1 is
used"; an equal-budget comparison with SCST's and MIXER's 5 samples per image sets 5). At every
step t, ``K`` roll-outs complete the prefix ``g_{1:t}`` to the end; their mean reward estimates

    Q(g_{1:t-1}, g_t) = 1/K sum_k R(g_{1:t}; g^k_{t+1:T})

(at the end token the caption is complete and Q is its reward). A baseline MLP
``B_phi(s_t)`` reads the RNN hidden state that produced ``pi(g_t | g_{1:t-1})``, detached,
so no gradient reaches the RNN through it, and is trained by MSE towards Q. The policy loss

    L_theta = - sum_t (Q(g_{1:t-1}, g_t) - B_phi(s_t)) log pi(g_t | g_{1:t-1})

is averaged over the sampled tokens of the global batch (as SCST here), and the baseline
loss ``sum_t (Q - B_phi)^2`` likewise; ``Q - B`` is a constant for the policy.

The baseline is fitted before the policy moves (``baseline_warmup_steps``): Liu et al.'s
Algorithm 1 trains B_phi on Monte-Carlo estimates of Q "on a small subset of D" after the MLE
stage and before the first policy-gradient update (the summary in shared/papers leaves the
algorithm out). During those first steps the loss is the baseline's alone and the sample is
decoded without gradient: the caption model gets none, so its optimiser leaves it as it is.
With a fresh baseline (B = 0) every sampled word would be reinforced by its whole reward at
first, which on the demo took the fc start from 127.0 to 103.0 val CIDEr-D in its first
epoch (``baseline_warmup_steps: 0`` does that). All roll-outs
of a batch are decoded as one batch (``caprl.decoding.rollouts_from_prefixes``), without gradient,
from the policy that sampled (``rollout_mode: policy``, train mode, its dropout on): Q_theta is
the expectation of R "over g_{t+1:T} ~ pi_theta" (the summary's definition of V_theta and Q_theta),
the same pi_theta whose sample the gradient weighs. ``rollout_mode: eval`` rolls out the
dropout-free network instead (caprl's former behaviour), which estimates Q for another policy
than the sampled one. Where the summary is silent: the roll-outs use the
same sampling temperature as the sample (1), and the baseline is a 2-layer MLP with a
ReLU (``baseline_hidden`` units) on the last stage's hidden state (``baseline_hidden: 0``:
a linear regressor, as MIXER's, :mod:`caprl.objectives.mixer`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from caprl import decoding
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, ObjectiveEnv, Options, one_of, register_objective


ROLLOUT_MODES = ("policy", "eval")


@dataclass
class PGSpiderOptions(Options):
    rollouts: int  # K Monte-Carlo roll-outs per step (paper: 3)
    reward: str  # a name under `rewards:` (cider_d, bcmr, spider, ...)
    baseline_lr: float  # learning rate of the baseline MLP
    baseline_hidden: int  # hidden units of the baseline MLP (0: a linear regressor)
    baseline_warmup_steps: int  # first training steps that fit only the baseline (Algorithm 1; 0: none)
    n_samples: int  # M: captions sampled per image (paper: 1)
    #: policy: roll-outs from the sampling policy (train mode); eval: without dropout
    rollout_mode: str = one_of(lambda: ROLLOUT_MODES)

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise CaprlError(f"pg_spider.n_samples: expected M >= 1 captions per image, got {self.n_samples}")


def baseline_network(hidden_size: int, baseline_hidden: int) -> nn.Module:
    """A reward regressor on the RNN hidden state ``[..., H] -> [..., 1]``: a 2-layer MLP with a
    ReLU of ``baseline_hidden`` units (PG-SPIDEr), or with 0 units a linear regressor (MIXER)."""
    if baseline_hidden == 0:
        return nn.Linear(hidden_size, 1)
    return nn.Sequential(nn.Linear(hidden_size, baseline_hidden), nn.ReLU(), nn.Linear(baseline_hidden, 1))


def monte_carlo_q(reward: Callable[[Sequence[int], Sequence[Sequence[str]]], np.ndarray],
                  image_ids: Sequence[int], completions: Sequence[Sequence[Sequence[Sequence[str]]]],
                  mask: np.ndarray) -> np.ndarray:
    """``Q [N, T]``: the mean reward of each step's ``K`` completed captions.

    ``completions[i][t][k]`` is the k-th completion (words) of image i's prefix up to step t;
    only steps with ``mask[i, t]`` are scored (others are 0). Identical (image, caption)
    pairs are scored once (an ended prefix's K completions are all the same caption).
    """
    n, steps = mask.shape
    keys: dict[tuple[int, tuple[str, ...]], int] = {}
    where: list[tuple[int, int, int]] = []
    for i in range(n):
        for t in range(steps):
            if mask[i, t]:
                for caption in completions[i][t]:
                    key = (int(image_ids[i]), tuple(caption))
                    where.append((i, t, keys.setdefault(key, len(keys))))
    q = np.zeros((n, steps), dtype=np.float64)
    if not keys:
        return q
    unique = list(keys)
    scores = np.asarray(reward([k[0] for k in unique], [list(k[1]) for k in unique]), dtype=np.float64)
    counts = np.zeros((n, steps))
    for i, t, j in where:
        q[i, t] += scores[j]
        counts[i, t] += 1
    return np.divide(q, counts, out=np.zeros_like(q), where=counts > 0)


@register_objective("pg_spider")
class PGSpider(Objective):
    holds = ("baseline",)
    Options = PGSpiderOptions
    options: PGSpiderOptions

    def __init__(self, options: PGSpiderOptions, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.baseline = baseline_network(model.config.hidden_size, options.baseline_hidden)

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.baseline.parameters()), "lr": self.options.baseline_lr, "name": "baseline"}]

    def q_values(self, model: CaptionModel, samples: decoding.Samples, batch: Batch) -> torch.Tensor:
        """Q for every sampled step, from ``rollouts`` completions of each prefix (no gradient)."""
        was_training = model.training
        model.train(was_training and self.options.rollout_mode == "policy")
        with torch.no_grad():
            completed = decoding.rollouts_from_prefixes(model, samples, self.options.rollouts, self.env.max_length,
                                                        noise=batch.noise, per_image=self.options.n_samples)
        model.train(was_training)
        n, steps, k = completed.shape[:3]
        live = samples.mask[:, -1, :steps] > 0  # steps of the caption (past its end: nothing to score)
        words = iter(self.env.decode_words(completed[live][:, :, -1].reshape(-1, completed.shape[-1])))
        mask = live.cpu().numpy()
        nested = [[[next(words) for _ in range(k)] if mask[i, t] else [] for t in range(steps)] for i in range(n)]
        ids = [i for i in batch.image_ids for _ in range(self.options.n_samples)]  # image-major, as decoded
        q = monte_carlo_q(self.env.reward(self.options.reward), ids, nested, mask)
        return self.tensor(q, like=samples.logprobs)

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        warming_up = self.warming_up(batch)
        with torch.no_grad() if warming_up else contextlib.nullcontext():  # no policy loss to reach the decode
            ctx = model.encode(batch.pooled, batch.regions)
            m = self.options.n_samples
            samples = decoding.rollout(model, decoding.start(model, ctx, m), self.env.max_length, noise=batch.noise,
                                       per_image=m, keep_hidden=True, keep_states=True)
        steps = len(samples.after)
        logprobs, mask = samples.logprobs[:, -1, :steps], samples.mask[:, -1, :steps]
        q = self.q_values(model, samples, batch)
        assert samples.hidden is not None
        b = self.baseline(samples.hidden[:, -1].detach()).squeeze(-1)  # [N, T]: no gradient into the RNN
        policy = -self.mean((q - b).detach() * logprobs, mask)
        baseline = self.mean((q - b) ** 2, mask)
        last = (mask.sum(dim=1).long() - 1).clamp(min=0)  # the end token's step: Q = the caption's reward
        metrics = {"policy_loss": float(policy.detach()), "baseline_mse": float(baseline.detach()),
                   "reward_sample": float(q.gather(1, last.unsqueeze(1)).mean())}
        if warming_up:  # the baseline alone
            return baseline, metrics
        return policy + baseline, metrics

    def warming_up(self, batch: Batch) -> bool:
        """True in the first ``baseline_warmup_steps`` training steps (a pure function of the
        trainer's step, so a resumed run warms up exactly as an uninterrupted one)."""
        step = batch.noise.step if batch.noise is not None else 0
        return step < self.options.baseline_warmup_steps
