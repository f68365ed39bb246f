"""What the policy-optimisation objectives (GRPO, PPO-KL, DiCO) share.

* A frozen **reference policy**: a copy of the caption model at its start (the XE run it is
  initialised from), taken by :meth:`Objective.begin` once the init is loaded; a child module
  with no optimiser group, so the trainer checkpoints and resumes it with the rest and DDP
  leaves it alone (no parameter of it requires a gradient). It always runs in eval mode,
  without gradient.
* :func:`caption_logprobs`: the log-probability of each word of given captions under a policy,
  teacher-forced (what a second optimiser pass over the same samples, or a reference, needs).
  Only single-stage models: a multi-stage model samples each stage from its own previous word,
  which teacher-forcing the last stage's words does not reproduce (:func:`single_stage` refuses).
* The per-token KL estimators of Schulman's note "Approximating KL divergence" (2020): ``k1``
  (the log-ratio, lm-human-preferences' and PPO-KL's) and ``k3`` (TRL's GRPO).
* :class:`MultiPass`: several optimiser updates on ONE batch of sampled captions (GRPO's
  ``num_iterations``, PPO's ``noptepochs``) as the trainer's turns: the first pass samples and
  scores, the later ones re-score the same captions under the updated policy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from caprl import decoding
from caprl.data.batch import Batch
from caprl.decoding import Samples
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Objective

REFERENCE_ROLE = "reference"  # the frozen start policy's role in checkpoints


def single_stage(model: CaptionModel, method: str) -> None:
    """Refuse a multi-stage model (its stages' captions cannot be re-scored by teacher-forcing)."""
    if model.n_stages != 1:
        raise CaprlError(f"method {method} re-scores sampled captions by teacher-forcing, which reproduces the "
                         f"sampling only for one-stage models; this model has {model.n_stages} stages (Stack-Cap): "
                         "train it with scst or c2f")


def frozen_copy(model: CaptionModel) -> CaptionModel:
    """A copy of ``model`` that no optimiser reaches: no gradient, eval mode."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference.eval()


def caption_logprobs(model: CaptionModel, batch: Batch, tokens: torch.Tensor, n: int) -> torch.Tensor:
    """``[N, T]``: the log-probability under ``model`` (in the mode the caller set) of each word of
    ``tokens [N, T]`` (``n`` captions per image of ``batch``, image-major; 0 after a caption's end,
    the end token's position included), column t for word t; the images encoded afresh."""
    ctx = decoding.expand(model.encode(batch.pooled, batch.regions), n)
    return model.token_logprobs(ctx, tokens)[:, -1, : tokens.shape[1]]


def reference_logprobs(reference: CaptionModel, batch: Batch, tokens: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`caption_logprobs` under the frozen reference: eval mode, no gradient."""
    reference.eval()
    with torch.no_grad():
        return caption_logprobs(reference, batch, tokens, n)


def k1(logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref per token: unbiased for KL(pi || pi_ref) on samples of pi."""
    return logprobs - ref


def k3(logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 per token: unbiased, never negative
    (DeepSeekMath eq. 4; TRL grpo_trainer.py ``_compute_loss``)."""
    delta = ref - logprobs
    return torch.exp(delta) - delta - 1


@dataclass
class Rollout:
    """One batch's sampled captions and what every pass over them reads (fixed after pass 1)."""

    batch: Batch
    samples: Samples
    old_logprobs: torch.Tensor  # [N, T] of the sampling policy, no gradient
    mask: torch.Tensor  # [N, T] words of the captions, end token included
    extra: dict[str, Any]


class PolicyObjective(Objective):
    """An objective anchored to its start: :meth:`hold_reference` keeps a frozen copy of the caption
    model (role ``reference`` in :attr:`keeps`), which :meth:`begin` sets to the loaded start."""

    def hold_reference(self, model: CaptionModel) -> None:
        self.reference = frozen_copy(model)
        self.keeps = (*type(self).keeps, REFERENCE_ROLE)

    def begin(self, model: CaptionModel) -> None:
        if REFERENCE_ROLE in self.keeps:
            self.reference.load_state_dict(model.state_dict())


class MultiPass(PolicyObjective):
    """An objective making ``passes`` optimiser updates on one batch of samples (the trainer's
    turns ``pass1 .. passK``; one pass: a plain :meth:`loss`). Subclasses implement
    :meth:`rollout` (sample, score; pass 1's differentiable log-probabilities in ``samples``)
    and :meth:`pass_loss`; :meth:`sampled` and :meth:`rescored` say what a pass reads of the
    current policy (the log-probabilities; a value head's values too)."""

    def set_passes(self, passes: int) -> None:
        self.turns = tuple(f"pass{i}" for i in range(1, passes + 1)) if passes > 1 else ()
        self._rollout: Rollout | None = None

    def rollout(self, model: CaptionModel, batch: Batch) -> Rollout:
        raise NotImplementedError

    def pass_loss(self, rollout: Rollout, current: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one pass; ``current``: what :meth:`sampled` / :meth:`rescored` gave (with gradient)."""
        raise NotImplementedError

    def sampled(self, rollout: Rollout) -> Any:
        """Pass 1's reading of the policy: the sampling's own log-probabilities ``[N, T]`` (ratio exactly 1)."""
        return rollout.samples.logprobs[:, -1]

    def rescored(self, model: CaptionModel, rollout: Rollout) -> Any:
        """A later pass's: the same captions' log-probabilities under the updated policy (train mode)."""
        return caption_logprobs(model, rollout.batch, rollout.samples.last_stage(), self._n(rollout))

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.turn_loss(model, batch, "pass1")

    def turn_loss(self, model: CaptionModel, batch: Batch, turn: str) -> tuple[torch.Tensor, dict[str, float]]:
        if turn == "pass1":
            rollout = self._rollout = self.rollout(model, batch)
            current = self.sampled(rollout)
        else:
            rollout = self._rollout
            if rollout is None or rollout.batch is not batch:
                raise RuntimeError(f"{self.name}: {turn} before pass1 on this batch")
            model.train()
            current = self.rescored(model, rollout)
        loss, metrics = self.pass_loss(rollout, current)
        if turn == (self.turns[-1] if self.turns else "pass1"):
            self._rollout = None  # nothing of a batch outlives its step (a checkpoint never needs it)
        return loss, metrics

    @staticmethod
    def _n(rollout: Rollout) -> int:
        return rollout.samples.tokens.shape[0] // len(rollout.batch.image_ids)
