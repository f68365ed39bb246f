"""Relaxed samples for straight-through estimators (paper 004: ST, PSST), by name.

* :data:`ESTIMATORS` turn a step's log-probabilities into the sampled word, its
  straight-through row and the relaxed distribution.
* :func:`partial_mask` / :func:`partial_token_mask` choose which rows pass their relaxed
  distribution (per caption, as the paper's text; per token and step, as the authors' code).
* :data:`FEEDS` say what each row reads at the next step of :func:`caprl.decoding.rollout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from caprl.errors import CaprlError
from caprl.registry import Registry

# --- relaxed samples (straight-through estimators), by name ------------------------------
# An estimator turns a step's log-probabilities into (the sampled word, its straight-through
# row: one-hot forward, the distribution's gradient backward, the relaxed distribution itself).
Estimator = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
ESTIMATORS: Registry[Callable[..., Estimator]] = Registry("relaxed-sample estimator")


def _one_hot_st(word: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Straight-through one-hot: the forward value is one-hot, the gradient that of ``probs``."""
    hard = F.one_hot(word, probs.shape[-1]).to(probs.dtype)
    return hard - probs.detach() + probs


@ESTIMATORS.register("st_gumbel")
def st_gumbel(tau: float = 1.0) -> Estimator:
    """Straight-through Gumbel-softmax (Jang et al.): the word is the argmax of a Gumbel-softmax
    sample (torch's ``gumbel_softmax``), the relaxed row that sample itself."""

    def estimate(logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        soft = F.gumbel_softmax(logprobs, tau=tau, hard=False, dim=-1)
        word = soft.argmax(dim=-1)
        return word, _one_hot_st(word, soft), soft

    return estimate


@ESTIMATORS.register("st_multinomial")
def st_multinomial(tau: float = 1.0) -> Estimator:
    """Straight-through multinomial: the word is sampled from softmax(logits / tau), the
    relaxed row is that whole distribution."""

    def estimate(logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = torch.softmax(logprobs / tau, dim=-1)
        flat = probs.detach().reshape(-1, probs.shape[-1])
        word = torch.multinomial(flat, 1).view(probs.shape[:-1])
        return word, _one_hot_st(word, probs), probs

    return estimate


def partial_mask(rows: int, rho: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """PSST (paper 004, sec. 5): ``[rows]`` True for the captions that pass their whole relaxed
    distribution (exactly ``round(rho * rows)`` of them, chosen by ``generator``); the rest
    pass straight-through one-hot rows. rho = 0 is plain straight-through."""
    count = int(round(rho * rows))
    pick = torch.zeros(rows, dtype=torch.bool)
    pick[torch.randperm(rows, generator=generator)[:count]] = True
    return pick.to(device)


def partial_token_mask(rows: int, steps: int, rho: float, generator: torch.Generator,
                       device: torch.device) -> torch.Tensor:
    """PSST as the authors' code runs it (models/multinomial_soft.py:24-33,
    models/gumbel_softmax.py:31-38): ``[rows, steps]``, each token relaxed on its own with
    probability ``rho``, a fresh draw at every step (drawn here for all steps at once, by
    ``generator``, so the decode loop never waits for the host)."""
    return (torch.rand(rows, steps, generator=generator) < rho).to(device)


# --- what each row reads at the next step, by name -----------------------------------------
@dataclass
class RelaxedStep:
    """One step of an estimator: the sampled ``word [N, S]``, its straight-through row
    ``straight [N, S, V]``, the relaxed distribution ``soft [N, S, V]`` and ``relaxed
    [N, 1, 1]`` (True: the row is relaxed at this step; None: no row is)."""

    word: torch.Tensor
    straight: torch.Tensor
    soft: torch.Tensor
    relaxed: torch.Tensor | None

    def passed(self) -> torch.Tensor:
        """The row passed on (``Samples.soft``): the relaxed distribution where relaxed, else
        the straight-through one-hot."""
        return self.straight if self.relaxed is None else torch.where(self.relaxed, self.soft, self.straight)


# A feed mode turns a step into (the word the row emits, what it reads at the next step:
# None for that word's id, or rows over the vocabulary, embedded as rows @ W).
Feed = Callable[[RelaxedStep], tuple[torch.Tensor, "torch.Tensor | None"]]
FEEDS: Registry[Feed] = Registry("feed mode")


@FEEDS.register("word")
def feed_word(step: RelaxedStep) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every row reads its sampled word (no gradient through the next input): ST Gumbel and ST
    multinomial, as the authors' code (models/AttModel.py:395-399, ``embed(it)``)."""
    return step.word, None


@FEEDS.register("relaxed")
def feed_relaxed(step: RelaxedStep) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PSST as the paper writes it (sec. 5: a relaxed sample is "a deterministic and
    differentiable variable"): a relaxed row reads its relaxed distribution (``soft @ W``,
    differentiable) and its word, which decides where it ends, is that distribution's argmax
    (deterministic for multinomial; for Gumbel the sampled word itself); the other rows read
    their sampled word, without gradient."""
    if step.relaxed is None:
        raise CaprlError("feed 'relaxed' needs the relaxed rows (rollout's relaxed=)")
    word = torch.where(step.relaxed.squeeze(-1), step.soft.detach().argmax(dim=-1), step.word)
    hard = F.one_hot(word, step.soft.shape[-1]).to(step.soft.dtype)
    return word, torch.where(step.relaxed, step.soft, hard)


@FEEDS.register("straight_through")
def feed_straight_through(step: RelaxedStep) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PSST as the authors' code runs it (models/AttModel.py:395-399 with
    models/multinomial_soft.py:24-33): every row reads the row it passes on, the relaxed
    distribution or the straight-through one-hot, gradients through every next input; the
    sampled word decides where it ends."""
    return step.word, step.passed()


def relaxed_at(relaxed: torch.Tensor | None, rows: int, steps: int) -> Callable[[int], torch.Tensor | None]:
    """Step i's ``[N, 1, 1]`` relaxed rows from a per-caption ``[N]`` or per-token ``[N, >= steps]``
    mask (a view: nothing is read back from the device)."""
    if relaxed is None:
        return lambda i: None
    if relaxed.dtype != torch.bool or relaxed.shape[0] != rows or relaxed.dim() not in (1, 2) or (
            relaxed.dim() == 2 and relaxed.shape[1] < steps):
        raise CaprlError(f"rollout: relaxed must be a bool [{rows}] or [{rows}, >= {steps}] mask, got "
                         f"{relaxed.dtype} {tuple(relaxed.shape)}")
    if relaxed.dim() == 1:
        per_caption = relaxed.view(-1, 1, 1)
        return lambda i: per_caption
    return lambda i: relaxed[:, i].view(-1, 1, 1)
