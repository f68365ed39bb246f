"""Vectorised n-gram machinery shared by the CIDEr-D and BLEU rewards.

Words are integers; an n-gram of order k > 1 is identified recursively by the pair
(id of its (k-1)-word prefix, id of its last word), packed into one int64 key
``prefix_id * num_words + last_word``. Sorting those keys gives every n-gram a dense id
without ever building Python tuples, and looking up a batch of n-grams is one vectorised
hash probe per order (:class:`KeyIndex`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

MAX_ORDER = 4


def encode(captions: Sequence[Sequence[str]], word_index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
    """Token lists -> (flat int64 word ids, int64 lengths, size of the id space).

    Words missing from ``word_index`` get ids ``len(word_index), len(word_index)+1, ...``
    local to this call (equal words share an id), so nothing persistent ever grows.
    """
    known = len(word_index)
    lengths = np.fromiter(map(len, captions), dtype=np.int64, count=len(captions))
    flat = np.fromiter(
        map(word_index.get, chain.from_iterable(captions), repeat(-1)), dtype=np.int64, count=int(lengths.sum())
    )
    missing = np.flatnonzero(flat < 0)
    unknown: dict[str, int] = {}
    if len(missing):
        tokens = list(chain.from_iterable(captions))
        for i in missing.tolist():
            flat[i] = unknown.setdefault(tokens[i], known + len(unknown))
    return flat, lengths, known + len(unknown)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: NumPy's hash-based ``unique`` is slow on large int64 arrays)."""
    values = np.sort(values)
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


class KeyIndex:
    """Positions of queries in a sorted array of distinct non-negative int64 keys.

    A hash table of int32 positions (open addressing, linear probing, load factor <= 1/4)
    answers most queries of an array with one gather; the few whose first probe is
    inconclusive fall back to a binary search.
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys
        bits = max(4, int(np.ceil(np.log2(max(4 * len(keys), 1)))))
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self.slots = np.full(1 << bits, -1, dtype=np.int32)
        pending = np.arange(len(keys), dtype=np.int64)
        slot = self._hash(keys)
        while len(pending):
            h = slot[pending]
            free = self.slots[h] == -1
            candidates = pending[free]
            _, winner = np.unique(h[free], return_index=True)  # one key per free slot
            self.slots[slot[candidates[winner]]] = candidates[winner]
            pending = pending[self.slots[h] != pending]
            slot[pending] = (slot[pending] + 1) & self._mask

    def _hash(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * self._MULT) >> self._shift).astype(np.int64)

    def get(self, queries: np.ndarray) -> np.ndarray:
        """Position of each query in ``keys``; -1 where absent (and for negative queries)."""
        pos = self.slots[self._hash(np.maximum(queries, 0))].astype(np.int64)
        hit = pos >= 0
        hit[hit] = self.keys[pos[hit]] == queries[hit]
        unsure = np.flatnonzero(~hit & (pos >= 0) & (queries >= 0))  # probe chain goes on
        out = np.where(hit, pos, -1)
        if len(unsure):
            q = queries[unsure]
            idx = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
            out[unsure] = np.where(self.keys[idx] == q, idx, -1)
        return out


@dataclass
class Occurrences:
    """The distinct (sentence, n-gram) pairs of a batch of sentences, per order 1..max_order.

    For order k, entry i of ``sentence[k-1]``, ``first[k-1]``, ``count[k-1]`` and
    ``gid[k-1]`` describes one distinct n-gram of one sentence: the sentence index, the
    start of its first occurrence in the flat word array, its term frequency in the
    sentence, and its id in the table passed to :func:`occurrences` (-1 if absent or if no
    table was given).
    """

    sentence: list[np.ndarray]
    first: list[np.ndarray]
    count: list[np.ndarray]
    gid: list[np.ndarray]


def occurrences(
    flat: np.ndarray,
    lengths: np.ndarray,
    space: int,
    table: NgramTable | None = None,
    max_order: int = MAX_ORDER,
) -> Occurrences:
    """Count n-grams per sentence (and look them up in ``table``) for a batch of sentences."""
    ends = np.cumsum(lengths)
    sent_of_word = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    left = ends[sent_of_word] - np.arange(len(flat))  # words left in the sentence, >= 1
    out = Occurrences([], [], [], [])
    pos = np.arange(len(flat), dtype=np.int64)
    local = gids = np.empty(0, np.int64)
    for k in range(1, max_order + 1):
        if k == 1:
            keys = sent_of_word * space + flat
            if table is not None:
                gids = np.where(flat < table.num_words, flat, -1)
        else:
            keep = left[pos] >= k
            pos, local = pos[keep], local[keep]
            last = flat[pos + k - 1]
            keys = local * space + last
            if table is not None:
                gids = table.lookup(k, gids[keep], last)
        _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        local = inverse.reshape(-1).astype(np.int64)
        out.sentence.append(sent_of_word[pos[first]])
        out.first.append(pos[first])
        out.count.append(counts)
        out.gid.append(gids[first] if table is not None else np.full(len(first), -1, np.int64))
    return out


class NgramTable:
    """A fixed, prefix-closed set of n-grams (orders 1..max_order) with dense global ids.

    Words are integers ``0..num_words-1`` and unigram ids are word ids; order-k n-grams follow in blocks
    (``offsets[k-1]`` is the first id of order k). The table never changes after
    construction: lookups of unseen n-grams return -1.
    """

    def __init__(self, num_words: int, row_sets: Sequence[np.ndarray], max_order: int = MAX_ORDER) -> None:
        """Build from int matrices (m, k) of word ids (< num_words), each one order k <= max_order
        (any number per order, duplicates allowed); their prefixes are added too."""
        self.num_words = num_words
        self.max_order = max_order
        self._index: list[KeyIndex] = []
        self.keys: list[np.ndarray] = [np.arange(num_words, dtype=np.int64)]
        self.offsets = [0]
        sets = [r for r in row_sets if r.ndim == 2 and 1 <= r.shape[1] <= max_order and len(r)]
        prefix_ids = [np.where(r[:, 0] < num_words, r[:, 0], -1).astype(np.int64) for r in sets]
        for k in range(2, max_order + 1):
            longer = [i for i, r in enumerate(sets) if r.shape[1] >= k]
            keys = [prefix_ids[i] * num_words + sets[i][:, k - 1] for i in longer]
            self.offsets.append(self.offsets[-1] + len(self.keys[-1]))
            self.keys.append(sorted_unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64))
            self._index.append(KeyIndex(self.keys[-1]))
            for i in longer:
                prefix_ids[i] = self.lookup(k, prefix_ids[i], sets[i][:, k - 1].astype(np.int64))
        self.size = self.offsets[-1] + len(self.keys[-1])
        self.order_of = np.concatenate([np.full(len(kk), k, np.int8) for k, kk in enumerate(self.keys)])

    def lookup(self, order: int, prefix_ids: np.ndarray, last_words: np.ndarray) -> np.ndarray:
        """Global ids of n-grams of ``order`` >= 2 given their prefix ids and last words; -1 if absent."""
        valid = (prefix_ids >= 0) & (last_words < self.num_words)
        pos = self._index[order - 2].get(np.where(valid, prefix_ids * self.num_words + last_words, -1))
        return np.where(pos >= 0, pos + self.offsets[order - 1], -1)

    def lookup_rows(self, rows: np.ndarray) -> np.ndarray:
        """Global ids of the n-grams in an int matrix (m, k) of word ids; -1 where absent."""
        ids = np.where(rows[:, 0] < self.num_words, rows[:, 0], -1).astype(np.int64)
        for k in range(2, rows.shape[1] + 1):
            ids = self.lookup(k, ids, rows[:, k - 1].astype(np.int64))
        return ids


def segment_search(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, queries: np.ndarray, steps: int) -> np.ndarray:
    """Vectorised binary search of ``queries[i]`` in ``values[lo[i]:hi[i]]`` (each segment sorted).

    Returns the index of the match or -1; ``steps`` >= log2(longest segment + 1).
    """
    last = len(values) - 1
    if last < 0:
        return np.full(len(queries), -1, dtype=np.int64)
    base = lo.copy()
    size = hi - lo
    for _ in range(steps):  # invariant: the match, if any, is in [base, base + size)
        half = size >> 1
        base += half * (values[np.minimum(base + half, last)] < queries)
        size -= half
    pos = base + ((values[np.minimum(base, last)] < queries) & (size > 0))
    found = (pos < hi) & (values[np.minimum(pos, last)] == queries)
    return np.where(found, pos, -1)
