"""Self-critical sequence training (Rennie et al. 2017): REINFORCE with the greedy caption as baseline.

Each image gets ``n_samples`` samples; every sample's advantage is its reward minus the
reward of the same image's greedy caption. Multi-stage models are trained on their last stage.

Option ``baseline`` (:data:`caprl.objectives.baselines.BASELINES`) picks the baseline; ``greedy``
is the paper's. ``baseline: nsc`` is Luo 2020's "new self-critical" (arXiv 2003.09971): the
same objective with each sample baselined by the mean reward of its image's other samples and
no greedy decode, as self-critical.pytorch runs it (``structure_loss_type: new_self_critical``
changes only the baseline). So NSC is ``method: scst`` with ``options: {baseline: nsc}``, not
a method of its own. Option ``greedy_mode`` (:data:`caprl.objectives.base.GREEDY_MODES`) says how
the greedy captions are decoded: params.yaml's ``eval`` is SCP's (captioning/modules/loss_wrapper.py:
``model.eval()``, the greedy caption under ``no_grad``, ``model.train()``, then the samples) and
paper 002's (caption_competition gen_model/self_critique.py: the roll-out fed ``is_training`` False).

``sll`` is the same objective under the SLE paper's name (paper 002, "SLL": sequence-level
learning, CIDEr-D, greedy baseline, s = 5 samples), so its tables find their runs by
method. With ``entropy`` > 0 the loss also maximises the sampling distribution's entropy
(Mnih et al.'s maximum-entropy regularisation; the SLE paper's "SLL-ME", weight 1e-2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, register_objective
from caprl.objectives.baselines import BASELINES, BaselineOptions


@dataclass
class SamplingOptions(BaselineOptions):  # n_samples, baseline
    reward: str  # a name under `rewards:`
    temperature: float
    #: SCP's remove_bad_endings while sampling (caprl.objectives.base.Objective.sampling_rule): off by default
    remove_bad_endings: bool = field(default=False, kw_only=True)


@dataclass
class SelfCriticalOptions(SamplingOptions):
    entropy: float  # weight of the maximum-entropy term (0: none)


@register_objective("scst")
class SelfCritical(Objective):
    Options = SelfCriticalOptions
    options: SelfCriticalOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n, weight = self.options.n_samples, self.options.entropy
        reward, baseline = self.env.reward(self.options.reward), BASELINES[self.options.baseline]
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature, keep_entropy=weight > 0,
                                                  greedy=baseline.greedy)
        ids = batch.image_ids
        r_greedy = None if greedy is None else np.asarray(reward(ids, self.env.decode_words(greedy.last_stage())))
        r_sample = np.asarray(reward([i for i in ids for _ in range(n)], self.env.decode_words(samples.last_stage())))
        advantage = self.tensor(baseline.advantage(r_sample, r_greedy, n), like=samples.logprobs)
        loss = -self.mean(advantage.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
        stats = {"reward_sample": float(r_sample.mean())}
        if r_greedy is not None:
            stats["reward_greedy"] = float(r_greedy.mean())
        if weight > 0:
            entropy = self.mean(samples.entropy[:, -1], samples.mask[:, -1])
            loss = loss - weight * entropy
            stats["entropy"] = float(entropy.detach())
        return loss, stats


@register_objective("sll")
class SequenceLevel(SelfCritical):
    """The SLE paper's SLL (and, with ``entropy`` > 0, SLL-ME): SCST under the paper's name."""
