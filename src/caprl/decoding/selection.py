"""How beam search keeps its beams: length penalties and diverse groups (``decode:``
``length_penalty``, ``length_alpha``, ``groups``, ``diversity_lambda``; each off by default).

* A length penalty ranks a hypothesis by its summed log-probability ``score`` and its length
  ``|Y|`` (its tokens, the end token included; a caption cut at the maximum length has that
  many), named in :data:`LENGTH_PENALTIES`. Finished hypotheses keep their length while the others
  grow, so the penalty ranks the candidates at every step and the final beams, not only the end
  (``none``: the plain score, as before).
* Diverse beam search (Vijayakumar et al. 2016, "Diverse Beam Search", Alg. 1 with Hamming
  diversity): the ``K`` beams are ``groups`` groups of ``K / groups``; at each step the groups
  choose in order, group g's candidate word w losing ``diversity_lambda`` times the number of
  beams of groups 1..g-1 that chose w at this step. As in the authors' code and
  self-critical.pytorch's port of it (captioning/models/CaptionModel.py), a beam's selection
  score sums these augmented log-probabilities; its log-probability stays the plain sum.

:func:`choose` is one step of it, on tensors only (no host read-back: it runs inside a CUDA
graph capture); :func:`caprl.decoding.beam_search` calls it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from caprl.registry import Registry

#: (score, length |Y|, alpha) -> the score beams are ranked by
LengthPenalty = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
LENGTH_PENALTIES: Registry[LengthPenalty] = Registry("length penalty")


@LENGTH_PENALTIES.register("none")
def no_penalty(score: torch.Tensor, length: torch.Tensor, alpha: float) -> torch.Tensor:
    """The summed log-probability itself (the most likely hypothesis wins)."""
    return score


@LENGTH_PENALTIES.register("wu")
def wu_penalty(score: torch.Tensor, length: torch.Tensor, alpha: float) -> torch.Tensor:
    """Wu et al. 2016 (GNMT, sec. 7): score / lp(Y), lp(Y) = ((5 + |Y|) / (5 + 1))^alpha
    (self-critical.pytorch's ``length_wu``, ``--length_penalty wu_<alpha>``)."""
    return score / ((5.0 + length) / 6.0) ** alpha


@LENGTH_PENALTIES.register("average")
def average_penalty(score: torch.Tensor, length: torch.Tensor, alpha: float) -> torch.Tensor:
    """The average log-probability per token, score / |Y| (self-critical.pytorch's
    ``length_average``, ``--length_penalty avg_<alpha>``, whose alpha is unused)."""
    return score / length


class Chosen(NamedTuple):
    beam: torch.Tensor  # [B, K] the beam each new beam extends
    word: torch.Tensor  # [B, K] its word
    selecting: torch.Tensor  # [B, K] its selection score (its log-probability plus the diversity terms)


def choose(selecting: torch.Tensor, logprobs: torch.Tensor, finished: torch.Tensor, grown: torch.Tensor,
           penalty: LengthPenalty, alpha: float, groups: int, diversity_lambda: float) -> Chosen:
    """The next beams: each group's ``K / groups`` best extensions of its own beams.

    ``selecting [B, K]`` each beam's selection score, ``logprobs [B, K, V]`` its words' (an ended
    beam's row: 0 for the end token, -inf elsewhere), ``finished [B, K]`` which beams ended before
    this step, ``grown [B, K]`` each beam's length after this step. Candidates are ranked by
    ``penalty(selecting + logprob - diversity, length, alpha)``.
    """
    batch, k, vocab = logprobs.shape
    per = k // groups
    counts: torch.Tensor | None = None  # [B, V]: beams of the groups before that chose each word at this step
    beams, words, scores = [], [], []
    for g in range(groups):
        part = slice(g * per, (g + 1) * per)
        lp = logprobs[:, part]
        if counts is not None:  # an ended beam chooses nothing, and is not penalised
            lp = torch.where(finished[:, part].unsqueeze(-1), lp, lp - diversity_lambda * counts.unsqueeze(1))
        cand = selecting[:, part].unsqueeze(-1) + lp  # [B, per, V]
        ranked = penalty(cand, grown[:, part].unsqueeze(-1).to(cand.dtype), alpha)
        index = ranked.view(batch, -1).topk(per, dim=1).indices
        beam, word = index // vocab, index % vocab
        beams.append(beam + g * per)
        words.append(word)
        scores.append(cand.view(batch, -1).gather(1, index))
        if g + 1 < groups:
            chose = (~finished[:, part].gather(1, beam)).to(logprobs.dtype)
            step = torch.zeros(batch, vocab, dtype=logprobs.dtype, device=logprobs.device).scatter_add(1, word, chose)
            counts = step if counts is None else counts + step
    return Chosen(torch.cat(beams, 1), torch.cat(words, 1), torch.cat(scores, 1))
