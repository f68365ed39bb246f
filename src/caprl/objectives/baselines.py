"""REINFORCE baselines by name: what a sampled caption's reward is compared with.

Every objective that scores ``n_samples`` sampled captions per image with a reward and a
baseline takes option ``baseline`` (a key of :data:`BASELINES`; default: its paper's):

* ``greedy`` (Rennie et al. 2017, SCST sec. 5: "the reward obtained by the current model
  under the inference algorithm used at test time", i.e. the greedy caption): b = r(greedy
  caption of the image). The greedy captions are decoded (no gradient) for it, in the mode of
  option ``greedy_mode`` (:data:`caprl.objectives.base.GREEDY_MODES`: eval, SCP's; train, the
  authors' code of papers 000 and 004; shared, caprl's former decode).
* ``nsc`` (Luo 2020, "A Better Variant of Self-Critical Sequence Training", arXiv 2003.09971;
  Mnih & Rezende 2016's baseline): b_i = the mean reward of the image's OTHER n - 1 samples,
  ``r_i - (1/(n-1)) sum_{j != i} r_j``; needs n_samples >= 2 (Luo: 5). As self-critical.pytorch's
  ``new_self_critical`` structure loss (captioning/modules/losses.py: ``(scores.sum(1,
  keepdim=True) - scores) / (scores.shape[1] - 1)``), no greedy caption is decoded: the
  objective skips the greedy decode and its reward, saving their cost (SCP's structure-loss
  branch, captioning/modules/loss_wrapper.py, samples only).

A baseline works on host (numpy) or device (torch) rewards alike, as the objectives hold them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
import torch

from caprl.errors import CaprlError
from caprl.objectives.base import GREEDY_MODES, Options, one_of
from caprl.registry import Registry

A = TypeVar("A", np.ndarray, torch.Tensor)


@dataclass(frozen=True)
class Baseline:
    """A baseline: whether it reads the greedy captions' rewards, the samples per image it
    needs, and its value ``(rewards [B, n], greedy rewards [B] or None) -> [B, n]`` (or broadcastable)."""

    greedy: bool
    min_samples: int
    values: Callable[[A, A | None], A]

    def advantage(self, rewards: A, greedy: A | None, n: int) -> A:
        """``[B * n]`` rewards (image-major: an image's n samples in a row) minus their baseline."""
        per_image = rewards.reshape(-1, n)
        return (per_image - self.values(per_image, greedy)).reshape(-1)


BASELINES: Registry[Baseline] = Registry("REINFORCE baseline")


def greedy_values(rewards: A, greedy: A | None) -> A:
    """Rennie et al. 2017: the reward of the image's greedy caption, ``[B, 1]``."""
    if greedy is None:
        raise ValueError("the greedy baseline needs the greedy captions' rewards")
    return greedy[:, None]


def mean_of_others(rewards: A, greedy: A | None) -> A:
    """Luo 2020: each sample's baseline is the mean reward of its image's other n - 1 samples."""
    return (rewards.sum(1, keepdims=True) - rewards) / (rewards.shape[1] - 1)


BASELINES.add("greedy", Baseline(greedy=True, min_samples=1, values=greedy_values))
BASELINES.add("nsc", Baseline(greedy=False, min_samples=2, values=mean_of_others))


@dataclass
class BaselineOptions(Options):
    """Options of a method with ``n_samples`` sampled captions per image and a REINFORCE baseline.
    ``baseline`` and ``greedy_mode`` have defaults (the greedy caption, every such method's paper;
    caprl's former greedy decode) only so that they switch a later addition off (as XE's
    ``ss_start``); params.yaml shows both per method."""

    n_samples: int  # samples per image
    #: a key of BASELINES: greedy (Rennie et al. 2017) | nsc (Luo 2020: the mean of the other samples)
    baseline: str = one_of(lambda: BASELINES, default="greedy")
    #: how the greedy captions are decoded, a key of caprl.objectives.base.GREEDY_MODES: eval (SCP's:
    #: encoded again, no dropout) | train (the authors' code of papers 000 and 004: dropout on) | shared
    #: (caprl's former: the samples' train-mode encoding, an eval-mode decoder); read by baseline greedy
    greedy_mode: str = one_of(lambda: GREEDY_MODES, default="shared")

    def check(self, where: str) -> None:
        super().check(where)
        need = BASELINES[self.baseline].min_samples
        if self.n_samples < need:
            raise CaprlError(f"{where}.baseline: baseline {self.baseline} needs n_samples >= {need}, got "
                             f"{where}.n_samples {self.n_samples}; raise n_samples or use baseline greedy")
