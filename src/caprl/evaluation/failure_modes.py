"""How an RL-trained captioner hacks its reward, measured on the evaluated captions (one per image).

RL on CIDEr-D and CLIP-S is known to end captions on a function word ("a man riding a", the
reason self-critical.pytorch added ``--remove_bad_endings``), to repeat phrases, and to drift in
length (Cho et al. 2022, sec. 3, on CLIP-S rewards). The score file's ``failure_modes`` section:

* ``bad_endings``: the share of captions whose last word is one of self-critical.pytorch's bad
  endings (:data:`caprl.decoding.constraints.BAD_ENDINGS`, ``captioning/models/AttModel.py``);
* ``repeated_bigrams``: seq-rep-2 of Welleck et al. 2020 ("Neural text generation with
  unlikelihood training", sec. 5.1: 1 - distinct n-grams / n-grams, per caption, averaged),
  n = 2: the share of a caption's word pairs that repeat an earlier pair of it, averaged over
  the captions (a caption of fewer than 3 words has no repeat: 0);
* ``mean_length``: words per caption.

The KL to the run's start (its ``init.model``) needs both models: :mod:`caprl.evaluation.start_kl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from caprl.decoding.constraints import BAD_ENDINGS
from caprl.errors import CaprlError

SECTION = "failure_modes"


def seq_rep(words: list[str], n: int = 2) -> float:
    """1 - distinct n-grams / n-grams of one caption (0 for a caption without n-grams)."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)


def failure_modes(captions: Mapping[int, str]) -> dict[str, Any]:
    """The section of the score file for ``captions`` (image id -> words separated by spaces)."""
    if not captions:
        raise CaprlError("failure modes: no captions given")
    words = [str(c).split() for c in captions.values()]
    n = len(words)
    bad = sum(bool(w) and w[-1] in BAD_ENDINGS for w in words)
    return {"bad_endings": bad / n, "repeated_bigrams": sum(seq_rep(w) for w in words) / n,
            "mean_length": sum(len(w) for w in words) / n, "captions": n, "bad_ending_captions": bad}
