"""What no evaluation caption may contain: UNK, a bad ending, a repeated trigram (``decode:``
``suppress_unk``, ``remove_bad_endings``, ``block_trigrams``; each off by default).

Each rule is a function of one step's log-probabilities ``[R, V]`` and the words each row has
emitted so far ``history [R, t]``; it sets the banned words to -inf and renormalises nothing (a
beam's score stays the summed log-probability of its words, as self-critical.pytorch scores
them). Every mask is made on the device of the log-probabilities from the step's own tensors
(comparisons with Python integers, no host copy, nothing read back), so the rules run inside a
captured CUDA graph (:mod:`caprl.decoding.captured`). :meth:`Constraints.rule` gives a decode
its rule; a decode whose rules ban every word of a row decides what that row does (greedy and
sampling leave such a step unconstrained, :func:`caprl.decoding.rollout`; a beam drops it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: self-critical.pytorch's list (captioning/models/AttModel.py, ``bad_endings``, the one its
#: decoding reads; captioning/utils/misc.py keeps another for cleaning printed captions)
BAD_ENDINGS = ("a", "an", "the", "in", "for", "at", "of", "with", "before", "after", "on", "upon", "near", "to",
               "is", "are", "am")

#: one step's rule: (log-probabilities [R, V], history [R, t], is this the last step) -> log-probabilities
Rule = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


def suppress_token(logprobs: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """Words of the mask ``banned [V]`` never emitted (SCP's ``--suppress_UNK``, which subtracts
    1000 from UNK's log-probability; here -inf: never)."""
    return logprobs.masked_fill(banned, float("-inf"))


def forbid_bad_endings(logprobs: torch.Tensor, history: torch.Tensor, bad: torch.Tensor, last: bool) -> torch.Tensor:
    """No caption ends in a word of the mask ``bad [V]``: the end token (0) is banned after one
    (SCP's ``--remove_bad_endings``, captioning/models/AttModel.py), and on the ``last`` step, whose
    word ends a caption cut at the maximum length, so are the bad words (SCP leaves a cut caption
    as it is)."""
    out = logprobs
    if history.shape[1] > 0:
        after_bad = bad[history[:, -1]].unsqueeze(1)  # [R, 1]
        out = torch.cat([out[:, :1].masked_fill(after_bad, float("-inf")), out[:, 1:]], dim=1)
    return out.masked_fill(bad, float("-inf")) if last else out


def block_repeated_trigrams(logprobs: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """No trigram twice in a caption: word w is banned where (h[t-2], h[t-1], w) is already one of
    the row's trigrams (SCP's ``--block_trigrams``, taken from lukemelas/image-paragraph-captioning,
    which subtracts 2 ln 2 per earlier occurrence and notes that the limit, -inf, works best)."""
    t = history.shape[1]
    if t < 3:
        return logprobs
    # earlier trigram i = (h[i], h[i+1], h[i+2]), i = 0 .. t-3, against the last two words
    match = (history[:, : t - 2] == history[:, t - 2 : t - 1]) & (history[:, 1 : t - 1] == history[:, t - 1 :])
    hits = torch.zeros_like(logprobs).scatter_add(1, history[:, 2:], match.to(logprobs.dtype))
    return logprobs.masked_fill(hits > 0, float("-inf"))


@dataclass(frozen=True)
class Constraints:
    """The rules a decode applies: ``unk`` (never emit UNK, the vocabulary's last word,
    :class:`caprl.data.vocab.Vocab`), ``bad_endings`` (word ids no caption may end in),
    ``block_trigrams``. Hashable: a captured decode's key holds it."""

    unk: bool = False
    bad_endings: tuple[int, ...] = ()
    block_trigrams: bool = False

    @classmethod
    def of(cls, suppress_unk: bool, remove_bad_endings: bool, block_trigrams: bool,
           words: Sequence[str] | None) -> "Constraints":
        """The rules of the ``decode:`` flags; ``words`` (the vocabulary, index order) names the
        bad endings (those it holds)."""
        bad = tuple(i for i, w in enumerate(words or ()) if w in BAD_ENDINGS) if remove_bad_endings else ()
        return cls(unk=bool(suppress_unk), bad_endings=bad, block_trigrams=bool(block_trigrams))

    def __bool__(self) -> bool:
        return self.unk or bool(self.bad_endings) or self.block_trigrams

    def rule(self) -> Rule:
        """A new decode's rule; its masks are made at its first step, on the step's device (inside a
        CUDA graph capture, in the graph's memory)."""
        masks: dict[str, torch.Tensor] = {}

        def apply(logprobs: torch.Tensor, history: torch.Tensor, last: bool) -> torch.Tensor:
            if not masks:
                ids = torch.arange(logprobs.shape[-1], device=logprobs.device)
                masks["unk"] = ids == ids.shape[0] - 1
                masks["bad"] = torch.zeros_like(ids, dtype=torch.bool)
                for w in self.bad_endings:
                    masks["bad"] = masks["bad"] | (ids == w)
            out = suppress_token(logprobs, masks["unk"]) if self.unk else logprobs
            out = forbid_bad_endings(out, history, masks["bad"], last) if self.bad_endings else out
            return block_repeated_trigrams(out, history) if self.block_trigrams else out

        return apply
