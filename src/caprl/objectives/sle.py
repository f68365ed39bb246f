"""Sequence-level exploration (paper 002, SLL-SLE; eq. 15-16): precision plus caption diversity.

For the ``s`` samples ``y_1..y_s`` of one image, sample ``j``'s surrogate loss (eq. 16) is::

    L_j = -alpha * Delta(y_j, y_i) * log p(y_j)  -  (1 - alpha) * (2/s) * sum_k d(y_j, y_k) * log p(y_j)

and the loss is their mean (eq. 15). As the paper does (sec. 4.3, 5.1):

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

The diversity term is chosen by the ``diversity`` option (:data:`DIVERSITY`):

* ``pairwise`` (the paper's text, above, the default);
* ``leave_one_out``: the first author's public code (marshimarocj/caption_competition,
  gen_model/trntst_util.py ``eval_bleu_diversity_in_rollout`` and gen_model/diversity.py
  ``feed_data_and_rollout``; expr/prepare_gen_cfg.py ``prepare_diversity``: reward_alpha
  .25 on diversity, n-gram orders [2:4]). Each sample is scored against ALL the image's
  other s - 1 samples at once as its references (coco-caption's Bleu(4), here
  :func:`caprl.rewards.leave_one_out_bleu`); its diversity reward is -(BLEU-3 + BLEU-4) / 2;
  the baseline is the mean of the image's s diversity rewards clipped from below at -0.5
  (``np.maximum(diverse_baselines, -.5)``), and the weight is the reward minus it, with no
  2/s factor. Combined as alpha (CIDEr-D - greedy CIDEr-D) + (1 - alpha) diversity.

Either way the loss is the weighted log-probability averaged over the sampled tokens of the
global batch (the code's ``reduce_sum(...) / reduce_sum(roll_mask)``).

Option ``baseline`` (:data:`caprl.objectives.baselines.BASELINES`) picks Delta's baseline:
``greedy`` (the paper's, above) or ``nsc`` (the mean CIDEr-D of the image's other samples, no
greedy decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, ObjectiveEnv, one_of, register_objective
from caprl.objectives.baselines import BASELINES
from caprl.objectives.scst import SamplingOptions
from caprl.registry import Registry
from caprl.rewards import leave_one_out_bleu, pairwise_bleu

Groups = Sequence[Sequence[Sequence[str]]]  # per image, its s samples' words
#: a diversity term by name: the image groups -> (the diversity weight of every sample [G, s], stats)
DiversityTerm = Callable[[Groups], tuple[np.ndarray, dict[str, float]]]
DIVERSITY: Registry[DiversityTerm] = Registry("SLE diversity term")
#: the authors' code clips the diversity baseline from below (gen_model/diversity.py)
LEAVE_ONE_OUT_BASELINE_FLOOR = -0.5


@dataclass
class ExplorationOptions(SamplingOptions):
    alpha: float  # weight of the precision term; 1 - alpha on the diversity term
    #: the diversity term, a key of DIVERSITY: pairwise (paper) | leave_one_out (authors' code)
    diversity: str = one_of(lambda: DIVERSITY)


def pairwise_distances(groups: Groups) -> np.ndarray:
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


def combine(precision: np.ndarray, greedy: np.ndarray, diversity: np.ndarray, alpha: float) -> np.ndarray:
    """``[G, s]``: the factor of -log p(y_j): alpha (Delta(y_j) - Delta(greedy)) + (1 - alpha) diversity."""
    return weigh(precision - greedy[:, None], diversity, alpha)


def weigh(advantage: np.ndarray, diversity: np.ndarray, alpha: float) -> np.ndarray:
    """``[G, s]``: alpha times Delta's advantage (Delta(y_j) minus its baseline) + (1 - alpha) diversity."""
    return alpha * advantage + (1.0 - alpha) * diversity


def sample_weights(precision: np.ndarray, greedy: np.ndarray, distance: np.ndarray, alpha: float) -> np.ndarray:
    """``[G, s]``: the factor of -log p(y_j) in eq. 16 with both baselines: alpha times
    (Delta(y_j) - Delta(greedy)) plus (1 - alpha) times the diversity weight."""
    return combine(precision, greedy, diversity_weights(distance), alpha)


@DIVERSITY.register("pairwise")
def pairwise_term(groups: Groups) -> tuple[np.ndarray, dict[str, float]]:
    """Eq. 15-16 (the paper's text): :func:`diversity_weights` of :func:`pairwise_distances`."""
    distance = pairwise_distances(groups)
    s = distance.shape[1]
    off_diagonal = distance.sum(axis=(1, 2)) / max(s * (s - 1), 1)
    return diversity_weights(distance), {"distance": float(off_diagonal.mean())}


def leave_one_out_rewards(groups: Groups) -> np.ndarray:
    """``[G, s]``: the authors' diversity reward, -(BLEU-3 + BLEU-4) / 2 of each sample with the
    group's other samples as its references (``-np.mean(score[2:4])``)."""
    bleu = leave_one_out_bleu(groups)  # [G * s, 4], coco-caption's Bleu(4)
    return -bleu[:, 2:4].mean(axis=1).reshape(len(groups), -1)


def leave_one_out_weights(rewards: np.ndarray) -> np.ndarray:
    """``[G, s]``: each reward minus its group's mean reward clipped from below at -0.5."""
    baseline = np.maximum(rewards.mean(axis=1, keepdims=True), LEAVE_ONE_OUT_BASELINE_FLOOR)
    return rewards - baseline


@DIVERSITY.register("leave_one_out")
def leave_one_out_term(groups: Groups) -> tuple[np.ndarray, dict[str, float]]:
    """The first author's code: :func:`leave_one_out_weights` of :func:`leave_one_out_rewards`."""
    rewards = leave_one_out_rewards(groups)
    return leave_one_out_weights(rewards), {"diversity_reward": float(rewards.mean())}


@register_objective("sll_sle")
class SequenceLevelExploration(Objective):
    Options = ExplorationOptions
    options: ExplorationOptions

    def __init__(self, options: ExplorationOptions, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.diversity = DIVERSITY.get(options.diversity, where="options.diversity")

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.options.n_samples
        reward, baseline = self.env.reward(self.options.reward), BASELINES[self.options.baseline]
        greedy, samples = self.greedy_and_samples(model, batch, n, self.options.temperature, greedy=baseline.greedy)
        ids = batch.image_ids
        words = self.env.decode_words(samples.last_stage())
        r_greedy = None if greedy is None else np.asarray(reward(ids, self.env.decode_words(greedy.last_stage())))
        r_sample = reward([i for i in ids for _ in range(n)], words).reshape(len(ids), n)
        diversity, stats = self.diversity([words[g * n:(g + 1) * n] for g in range(len(ids))])
        advantage = baseline.advantage(r_sample, r_greedy, n).reshape(len(ids), n)
        weights = weigh(advantage, diversity, self.options.alpha)
        weight = self.tensor(weights.reshape(-1), like=samples.logprobs)
        loss = -self.mean(weight.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
        greedy_stats = {} if r_greedy is None else {"reward_greedy": float(r_greedy.mean())}
        return loss, {"reward_sample": float(r_sample.mean()), **greedy_stats, **stats}
