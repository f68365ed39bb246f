"""BLEU-1..4 exactly as pycocoevalcap's ``BleuScorer`` computes them, vectorised.

Per candidate: n-gram matches clipped by the largest count in any one reference, the
"closest" reference length (ties go to the shorter reference), and pycocoevalcap's
smoothing constants (``tiny`` = 1e-15 added to matches, ``small`` = 1e-9 to guesses).
Sentence scores are ``BleuScorer``'s per-image list; corpus scores pool the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.base import Reward
from caprl.rewards.ngrams import NgramTable, encode, occurrences
from caprl.rewards.references import ReferenceSet, expand_ranges

ORDERS = 4
TINY = 1e-15
SMALL = 1e-9


@dataclass
class BleuStats:
    """Per-candidate counts: lengths (B,), closest reference lengths (B,), guesses and matches (B, 4)."""

    testlen: np.ndarray
    reflen: np.ndarray
    guess: np.ndarray
    correct: np.ndarray


def bleu_stats(refs: ReferenceSet, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> BleuStats:
    """BLEU counts of each caption against the references of its image."""
    slots = refs.slots(image_ids)
    batch = len(captions)
    cap, order, gid, tf, lengths = refs.candidate_ngrams(captions)
    seen = np.flatnonzero(gid >= 0)
    run = refs.find_runs(slots[cap[seen]], order[seen], gid[seen])
    seen, run = seen[run >= 0], run[run >= 0]
    clipped = np.minimum(tf[seen], refs.max_tf()[run])
    correct = np.bincount(cap[seen] * ORDERS + order[seen], clipped, minlength=batch * ORDERS)
    guess = np.maximum(lengths[:, None] - np.arange(ORDERS), 0)
    # closest reference length: minimise (|ref - test|, ref)
    lo, hi = refs.ref_ptr[slots], refs.ref_ptr[slots + 1]
    owner, ref = expand_ranges(lo, hi)
    ref_len = refs.ref_len[ref]
    scale = int(ref_len.max(initial=0)) + 1
    key = np.abs(ref_len - lengths[owner]) * scale + ref_len
    starts = np.cumsum(hi - lo) - (hi - lo)
    reflen = np.minimum.reduceat(key, starts) % scale if batch else np.zeros(0, np.int64)
    return BleuStats(lengths, reflen, guess.astype(np.float64), correct.reshape(batch, ORDERS))


def sentence_bleu(stats: BleuStats) -> np.ndarray:
    """Per-candidate BLEU-1..4, shape (B, 4), as ``BleuScorer.compute_score``'s second output."""
    bleu = np.cumprod((stats.correct + TINY) / (stats.guess + SMALL), axis=1)
    bleu = bleu ** (1.0 / np.arange(1, ORDERS + 1))
    ratio = (stats.testlen + TINY) / (stats.reflen + SMALL)
    with np.errstate(divide="ignore", over="ignore"):
        brevity = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return bleu * brevity[:, None]


def corpus_bleu(stats: BleuStats) -> np.ndarray:
    """Corpus BLEU-1..4 over all candidates, as ``BleuScorer.compute_score``'s first output."""
    bleu = np.cumprod((stats.correct.sum(axis=0) + TINY) / (stats.guess.sum(axis=0) + SMALL))
    bleu = bleu ** (1.0 / np.arange(1, ORDERS + 1))
    ratio = (stats.testlen.sum() + TINY) / (stats.reflen.sum() + SMALL)
    return bleu * (np.exp(1 - 1 / ratio) if ratio < 1 else 1.0)


def bleu_against(candidates: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> BleuStats:
    """BLEU counts of ``candidates[i]`` against its own reference list ``references[i]``."""
    if len(candidates) != len(references):
        raise CaprlError(f"bleu: {len(candidates)} candidates but {len(references)} reference lists")
    refset = ReferenceSet({i: refs for i, refs in enumerate(references)})
    return bleu_stats(refset, list(range(len(candidates))), candidates)


def leave_one_out_bleu(groups: Sequence[Sequence[Sequence[str]]]) -> np.ndarray:
    """BLEU-1..4 of every sample against the other samples of its group, shape (total, 4).

    ``groups[g]`` are the samples of one image (at least 2); rows follow the flattened
    order of ``groups``. This is the SLE diversity similarity (and mBLEU's building block).
    """
    candidates, references = [], []
    for g, group in enumerate(groups):
        if len(group) < 2:
            raise CaprlError(f"bleu: group {g} has {len(group)} sample(s); leave-one-out BLEU needs at least 2")
        for j, sample in enumerate(group):
            candidates.append(sample)
            references.append([s for k, s in enumerate(group) if k != j])
    if not candidates:
        return np.zeros((0, ORDERS))
    return sentence_bleu(bleu_against(candidates, references))


def pairwise_bleu(groups: Sequence[Sequence[Sequence[str]]]) -> list[np.ndarray]:
    """Per group, an (s, s, 4) array: ``[j, k]`` = BLEU-1..4 of sample j with sample k as its
    only reference. The diagonal is NaN (a sample is not compared with itself).

    Vectorised over every pair of every group (the SLE objective scores s(s-1) pairs per
    image each step): the samples' n-grams get global ids once, the clipped matches of a
    pair are the summed minimum counts of the n-grams both hold, and with one reference the
    reference length is that sample's length.
    """
    sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
    out = [np.full((int(n), int(n), ORDERS), np.nan) for n in sizes]
    samples = [sample for group in groups for sample in group]
    if int((sizes * (sizes - 1)).sum()) == 0:
        return out
    words = {w: i for i, w in enumerate(dict.fromkeys(chain.from_iterable(samples)))}
    flat, lengths, space = encode(samples, words)
    rows = occurrences(flat, lengths, space)
    table = NgramTable(space, [flat[rows.first[k][:, None] + np.arange(k + 1)] for k in range(ORDERS)])
    occ = occurrences(flat, lengths, space, table)
    group_of = np.repeat(np.arange(len(groups), dtype=np.int64), sizes)
    start = np.cumsum(sizes) - sizes
    smax = int(sizes.max())
    correct = np.zeros(len(groups) * smax * smax * ORDERS)
    for k in range(ORDERS):  # entries (sample, n-gram, count) -> pairs of samples of a group sharing an n-gram
        sample, gid, count = occ.sentence[k], occ.gid[k], occ.count[k]
        order = np.lexsort((gid, group_of[sample]))
        sample, gid, count = sample[order], gid[order], count[order]
        key = group_of[sample] * table.size + gid
        bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
        run = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        entry, partner = expand_ranges(bounds[run], bounds[run + 1])
        keep = entry != partner
        entry, partner = entry[keep], partner[keep]
        j, m = sample[entry], sample[partner]
        g = group_of[j]
        slot = ((g * smax + j - start[g]) * smax + m - start[g]) * ORDERS + k
        correct += np.bincount(slot, np.minimum(count[entry], count[partner]), minlength=len(correct))
    pair_j, pair_k = expand_ranges(start[group_of], (start + sizes)[group_of])  # every (j, k) of a group
    keep = pair_j != pair_k
    pair_j, pair_k = pair_j[keep], pair_k[keep]
    pair_g = group_of[pair_j]
    local_j, local_k = pair_j - start[pair_g], pair_k - start[pair_g]
    slots = ((pair_g * smax + local_j) * smax + local_k)[:, None] * ORDERS + np.arange(ORDERS)
    stats = BleuStats(testlen=lengths[pair_j], reflen=lengths[pair_k],
                      guess=np.maximum(lengths[pair_j][:, None] - np.arange(ORDERS), 0).astype(np.float64),
                      correct=correct[slots])
    dense = np.full((len(groups), smax, smax, ORDERS), np.nan)
    dense[pair_g, local_j, local_k] = sentence_bleu(stats)
    out = [dense[g, :n, :n] for g, n in enumerate(sizes.tolist())]
    return out


class Bleu(Reward):
    """Sentence BLEU-n (pycocoevalcap's per-sentence score) against fixed references."""

    def __init__(self, references: ReferenceSet, n: int = 4) -> None:
        if not 1 <= n <= ORDERS:
            raise CaprlError(f"bleu: order must be 1..{ORDERS}, got {n}")
        self.refs = references
        self.n = n
        self.name = f"bleu{n}"
        references.max_tf()  # build the clipping counts now, not during the first RL step

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        """Sentence BLEU-n of each caption (float64 array)."""
        self.check_batch(image_ids, captions)
        if not captions:
            return np.zeros(0)
        return sentence_bleu(bleu_stats(self.refs, image_ids, captions))[:, self.n - 1].copy()
