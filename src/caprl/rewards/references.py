"""Reference captions prepared once for fast rewards: n-gram table and term frequencies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.document_frequencies import DocumentFrequencies
from caprl.rewards.ngrams import MAX_ORDER, NgramTable, encode, occurrences

References = Mapping[int, Sequence[Sequence[str]]]


class ReferenceSet:
    """Tokenised references of many images, prepared once and never modified.

    * ``table``: every n-gram (orders 1-4) of the references and of the document
      frequencies, with dense ids; ``df_count[id]`` is its document frequency (0 if absent).
    * ``entry_key`` (sorted), ``entry_ref``, ``entry_tf``: one entry per distinct n-gram of
      each reference sentence, keyed by ``image_slot * table.size + ngram_id``.
    * ``ref_ptr``: references of image slot ``s`` are sentences ``ref_ptr[s]:ref_ptr[s+1]``;
      ``ref_len``: their lengths in words.

    Scoring a batch only looks things up here; unseen candidate n-grams get id -1 and are
    never added anywhere.
    """

    def __init__(self, references: References, document_frequencies: DocumentFrequencies | None = None) -> None:
        if not references:
            raise CaprlError("no reference captions given")
        self.image_ids = list(references)
        self.slot = {int(img): s for s, img in enumerate(self.image_ids)}
        sentences: list[Sequence[str]] = []
        counts = []
        for img, refs in references.items():
            if len(refs) == 0:
                raise CaprlError(f"image {img} has no reference captions")
            sentences.extend(refs)
            counts.append(len(refs))
        self.ref_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        df = document_frequencies
        words = list(df.words) if df is not None else []
        index = {w: i for i, w in enumerate(words)}
        for ref in sentences:
            for w in ref:
                if w not in index:
                    index[w] = len(words)
                    words.append(w)
        self.words = words
        self.word_index = index
        flat, lengths, space = encode(sentences, index)
        occ = occurrences(flat, lengths, space)
        rows = [flat[occ.first[k][:, None] + np.arange(k + 1)] for k in range(MAX_ORDER)]
        df_rows = list(df.ngrams) if df is not None else []
        all_rows = [
            np.concatenate([rows[k], df_rows[k]]) if k < len(df_rows) else rows[k] for k in range(MAX_ORDER)
        ]
        self.table = NgramTable(len(words), all_rows)
        self.df_count = np.zeros(self.table.size, dtype=np.float64)
        self.num_documents = df.num_documents if df is not None else len(references)
        for k, (df_r, df_c) in enumerate(zip(df_rows, df.counts if df is not None else [])):
            if k < MAX_ORDER:
                self.df_count[self.table.lookup_rows(df_r)] = df_c
        gid = np.concatenate([self.table.lookup_rows(r) for r in rows])
        ref = np.concatenate(occ.sentence)
        slot_of_ref = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        key = slot_of_ref[ref] * self.table.size + gid
        order = np.lexsort((ref, key))
        self.entry_key = key[order]
        self.entry_ref = ref[order]
        self.entry_gid = gid[order]
        self.entry_tf = np.concatenate(occ.count)[order].astype(np.int32)
        self.ref_len = lengths
        self._max_counts: tuple[np.ndarray, np.ndarray] | None = None

    def slots(self, image_ids: Sequence[int]) -> np.ndarray:
        """Slots of ``image_ids``; CaprlError naming the first id without references."""
        try:
            return np.fromiter((self.slot[int(i)] for i in image_ids), dtype=np.int64, count=len(image_ids))
        except KeyError as exc:
            raise CaprlError(f"image id {exc.args[0]} has no reference captions in this reward's references") from None

    def max_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted keys ``slot * table.size + id``, max term frequency over the image's references)."""
        if self._max_counts is None:
            starts = np.flatnonzero(np.r_[True, self.entry_key[1:] != self.entry_key[:-1]])
            self._max_counts = (self.entry_key[starts], np.maximum.reduceat(self.entry_tf, starts))
        return self._max_counts

    def candidate_ngrams(self, captions: Sequence[Sequence[str]]) -> tuple[np.ndarray, ...]:
        """Distinct n-grams of each caption, all orders concatenated.

        Returns (caption index, order-1 (0..3), table id or -1, term frequency, lengths).
        """
        flat, lengths, space = encode(captions, self.word_index)
        occ = occurrences(flat, lengths, space, self.table)
        order = np.concatenate([np.full(len(s), k, np.int64) for k, s in enumerate(occ.sentence)])
        return (
            np.concatenate(occ.sentence),
            order,
            np.concatenate(occ.gid),
            np.concatenate(occ.count).astype(np.float64),
            lengths,
        )


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges ``[lo[i], hi[i])``: (owner i of each element, the element index)."""
    n = hi - lo
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), n)
    starts = np.cumsum(n) - n
    return owner, lo[owner] + (np.arange(int(n.sum()), dtype=np.int64) - starts[owner])
