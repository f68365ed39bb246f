"""ROUGE-L as pycocoevalcap computes it (``Rouge.calc_score``, beta 1.2), with the LCS length
found by a bit-parallel algorithm instead of a Python dynamic-programming table.

pycocoevalcap fills an ``(m + 1) x (n + 1)`` table in Python for every (candidate,
reference) pair: ~0.5 ms a caption here, most of PG-SPIDEr's BCMR reward after METEOR.
The LCS length is the same number found with one machine-word (Python int) operation per
candidate word (Hyyrö 2004, "Bit-parallel LCS-length computation revisited"): each
reference's word positions become bit masks once per image, and a caption costs a few
integer additions per reference. Precision, recall and the F-measure are then computed with
pycocoevalcap's own expressions, in the same order, so the floats are identical
(``tests/test_rewards_registry.py`` checks that against pycocoevalcap).
"""

from __future__ import annotations

from collections.abc import Sequence

BETA = 1.2  # pycocoevalcap's (Lin and Hovy 2004, as updated by its authors)


class ReferenceMasks:
    """One reference sentence as ``(length, word -> bit mask of its positions)``."""

    __slots__ = ("length", "masks", "full")

    def __init__(self, sentence: str) -> None:
        tokens = sentence.split(" ")  # pycocoevalcap splits on single spaces
        self.length = len(tokens)
        self.masks: dict[str, int] = {}
        for position, token in enumerate(tokens):
            self.masks[token] = self.masks.get(token, 0) | (1 << position)
        self.full = (1 << self.length) - 1

    def lcs(self, tokens: Sequence[str]) -> int:
        """Length of the longest common subsequence of this reference and ``tokens``."""
        v, masks = self.full, self.masks
        for token in tokens:
            u = v & masks.get(token, 0)
            v = (v + u) | (v - u)
        return self.length - bin(v & self.full).count("1")


def rouge_l(candidate: str, references: Sequence[ReferenceMasks]) -> float:
    """pycocoevalcap ``Rouge().calc_score([candidate], refs)`` for prepared references."""
    tokens = candidate.split(" ")
    prec, rec = [], []
    for ref in references:
        lcs = ref.lcs(tokens)
        prec.append(lcs / float(len(tokens)))
        rec.append(lcs / float(ref.length))
    prec_max, rec_max = max(prec), max(rec)
    if prec_max != 0 and rec_max != 0:
        return ((1 + BETA**2) * prec_max * rec_max) / float(rec_max + BETA**2 * prec_max)
    return 0.0
