"""Vectorised n-gram machinery shared by the CIDEr-D and BLEU rewards.

Words are integers; an n-gram of order k > 1 is identified recursively by the pair
(id of its (k-1)-word prefix, id of its last word), packed into one int64 key
``prefix_id * num_words + last_word``. Sorting those keys gives every n-gram a dense id
without ever building Python tuples, and looking up a batch of n-grams is one
``np.searchsorted`` per order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAX_ORDER = 4


def encode(captions: Sequence[Sequence[str]], word_index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
    """Token lists -> (flat int64 word ids, int64 lengths, size of the id space).

    Words missing from ``word_index`` get ids ``len(word_index), len(word_index)+1, ...``
    local to this call (equal words share an id), so nothing persistent ever grows.
    """
    known = len(word_index)
    unknown: dict[str, int] = {}
    flat: list[int] = []
    append = flat.append
    for caption in captions:
        for token in caption:
            wid = word_index.get(token)
            if wid is None:
                wid = unknown.setdefault(token, known + len(unknown))
            append(wid)
    lengths = np.fromiter((len(c) for c in captions), dtype=np.int64, count=len(captions))
    return np.asarray(flat, dtype=np.int64), lengths, known + len(unknown)


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

    def __init__(self, num_words: int, rows: Sequence[np.ndarray], max_order: int = MAX_ORDER) -> None:
        """``rows[k-1]`` is an int matrix (m, k) of word ids (< num_words) of order-k n-grams
        (duplicates allowed); missing prefixes are added so the set is prefix-closed."""
        self.num_words = num_words
        self.max_order = max_order
        rows = [np.asarray(r, dtype=np.int64).reshape(-1, k + 1) for k, r in enumerate(rows)]
        rows += [np.zeros((0, k + 1), np.int64) for k in range(len(rows), max_order)]
        for k in range(max_order, 1, -1):  # prefix closure, from the longest order down
            rows[k - 2] = np.concatenate([rows[k - 2], rows[k - 1][:, : k - 1]])
        self.keys: list[np.ndarray] = [np.arange(self.num_words, dtype=np.int64)]
        self.offsets = [0]
        for k in range(2, max_order + 1):
            ids = self.lookup_rows(rows[k - 1][:, : k - 1])
            keys = np.unique(ids * self.num_words + rows[k - 1][:, k - 1])
            self.offsets.append(self.offsets[-1] + len(self.keys[-1]))
            self.keys.append(keys)
        self.size = self.offsets[-1] + len(self.keys[-1])
        self.order_of = np.concatenate([np.full(len(kk), k, np.int8) for k, kk in enumerate(self.keys)])

    def lookup(self, order: int, prefix_ids: np.ndarray, last_words: np.ndarray) -> np.ndarray:
        """Global ids of n-grams of ``order`` >= 2 given their prefix ids and last words; -1 if absent."""
        keys = self.keys[order - 1]
        valid = (prefix_ids >= 0) & (last_words < self.num_words)
        query = np.where(valid, prefix_ids * self.num_words + last_words, -1)
        idx = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
        hit = valid & (keys[idx] == query) if len(keys) else np.zeros(len(query), bool)
        return np.where(hit, idx + self.offsets[order - 1], -1)

    def lookup_rows(self, rows: np.ndarray) -> np.ndarray:
        """Global ids of the n-grams in an int matrix (m, k) of word ids; -1 where absent."""
        rows = np.asarray(rows, dtype=np.int64)
        ids = np.where(rows[:, 0] < self.num_words, rows[:, 0], -1)
        for k in range(2, rows.shape[1] + 1):
            ids = self.lookup(k, ids, rows[:, k - 1])
        return ids
