"""How words are drawn: Gumbel noise for training decodes (:class:`Noise`), and for evaluation's
sampling top-k and nucleus (top-p) truncation at a temperature, drawn from a seeded generator
(``decode:`` ``top_k``, ``top_p``, ``temperature`` of the ``sample`` decoder; each off by default).

The order is the usual one (Hugging Face's ``generate``): the temperature first (the decode's
log-probabilities are ``log_softmax(logits / T)``, :func:`caprl.decoding.rollout`), then the
constraints (:mod:`caprl.decoding.constraints`), then top-k, then top-p; the word is drawn from
what is left, renormalised. With a ``torch.Generator`` (on the model's device, seeded by the
caller from params ``seed`` once per decoded split) the draw is Gumbel-max with that generator's
noise for every row of the batch (:class:`GeneratorNoise`), so reruns agree, and a CPU decode that
drops its ended rows (:mod:`caprl.decoding.live_rows`) samples what stepping every row would.
Everything stays on the device, with nothing read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from caprl.decoding.constraints import Constraints, Rule


def top_k_filter(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Only the ``k`` most likely words of each row (top-k sampling: Fan et al. 2018, "Hierarchical
    Neural Story Generation"); a word tied with the k-th is kept too. ``k`` 0 (or at
    least the vocabulary): every word."""
    if k <= 0 or k >= logprobs.shape[-1]:
        return logprobs
    kth = logprobs.topk(k, dim=-1).values[..., -1:]
    return logprobs.masked_fill(logprobs < kth, float("-inf"))


def top_p_filter(logprobs: torch.Tensor, p: float) -> torch.Tensor:
    """The nucleus of each row (Holtzman et al. 2019, "The Curious Case of Neural Text
    Degeneration", sec. 3.1): the fewest most likely words whose probabilities (``logprobs``
    renormalised) sum to at least ``p``, i.e. a word is kept when the words more likely than it
    hold less than ``p``. ``p`` 1: every word."""
    if p >= 1.0:
        return logprobs
    ordered, order = logprobs.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # the mass of the words more likely than each
    drop = (before >= p).scatter(-1, order, before >= p)  # back to vocabulary order (order is a permutation)
    return logprobs.masked_fill(drop, float("-inf"))


def sampling_rule(constraints: Constraints, top_k: int, top_p: float) -> Rule | None:
    """A sample decode's rule (constraints, then top-k, then top-p), None when all are off."""
    constrain = constraints.rule() if constraints else None
    if constrain is None and top_k <= 0 and top_p >= 1.0:
        return None

    def apply(logprobs: torch.Tensor, history: torch.Tensor, last: bool) -> torch.Tensor:
        out = constrain(logprobs, history, last) if constrain is not None else logprobs
        return top_p_filter(top_k_filter(out, top_k), top_p)

    return apply


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniform ``u``."""
    return -torch.log((-torch.log(u.clamp(min=1e-20))).clamp(min=1e-20))


class GumbelNoise(Protocol):
    """What :func:`caprl.decoding.rollout` samples with: :class:`Noise` or :class:`GeneratorNoise`."""

    calls: int

    def gumbel(self, t: int, rows: int, per_image: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        ...


@dataclass
class Noise:
    """Sampling noise that depends only on (seed, step, call, position, global row).

    A batch split over several processes (DDP) draws, for its rows, exactly the noise one
    process would draw for the whole batch, so both sample the same captions. The image
    block this process holds is ``[offset, offset + its images)`` of ``total`` images. The
    noise is drawn on the device of the model.
    """

    seed: int
    step: int
    total: int
    offset: int = 0
    calls: int = 0

    def gumbel(self, t: int, rows: int, per_image: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(hash((self.seed, self.step, self.calls, t)) % (2**63))
        start = self.offset * per_image
        u = torch.rand(self.total * per_image, *shape, generator=gen, device=device)[start : start + rows]
        return _gumbel(u)


@dataclass
class GeneratorNoise:
    """Gumbel noise drawn from ``generator`` for every row of the batch at every step (the
    ``noise`` :func:`caprl.decoding.rollout` reads: ``gumbel(t, rows, per_image, shape, device)``)."""

    generator: torch.Generator
    calls: int = 0

    def gumbel(self, t: int, rows: int, per_image: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        return _gumbel(torch.rand(rows, *shape, generator=self.generator, device=device))
