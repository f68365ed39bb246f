"""Reference captions for rewards: which texts (:class:`RewardReferences`), and the n-gram table and
term frequencies prepared once for fast rewards (:class:`ReferenceSet`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.document_frequencies import DocumentFrequencies
from caprl.rewards.ngrams import MAX_ORDER, NgramTable, encode, occurrences, segment_search

if TYPE_CHECKING:
    from caprl.data.vocab import Labels, Vocab

References = Mapping[int, Sequence[Sequence[str]]]


@dataclass(frozen=True)
class RewardReferences:
    """The texts a reward of one split's images may score against, one per convention
    (:mod:`caprl.rewards.config`, ``eos``):

    * ``captions``: the annotations' tokenised captions, full length, as written
      (marshimarocj/caption_competition's ``human_caption_dict.pkl``);
    * ``labels``: the training labels as words, as self-critical.pytorch builds its reward's
      references (``captioning/data/dataloader.py``: ``data['gts']`` are the label arrays that
      ``scripts/prepro_labels.py`` clipped to ``max_length``): each caption clipped to
      ``label_length`` words, rare words UNK;
    * ``label_length``: the label arrays' width (``vocab.max_length``, never ``decode.max_length``);
    * ``unk_captions``: the full captions with the rare words UNK (``scripts/prepro_ngrams.py``'s
      document-frequency corpus).
    """

    captions: References
    labels: References
    label_length: int
    unk_captions: References

    @classmethod
    def from_labels(cls, captions: References, labels: Labels, vocab: Vocab) -> RewardReferences:
        """The references of the images of ``captions`` (a split's, :func:`references_from_annotations`):
        their label rows (``caprl vocab``'s file) read back as words."""
        words = vocab.idx_to_word
        rows: dict[int, list[list[str]]] = {}
        for image_id, caps in captions.items():
            ids, lengths = labels.captions(image_id), labels.lengths(image_id)
            if len(ids) != len(caps):
                raise CaprlError(f"{labels.path}: image {image_id} has {len(ids)} label rows but {len(caps)} "
                                 "captions in the annotations; rerun `caprl vocab`")
            rows[int(image_id)] = [[words[int(t)] for t in row[:n]] for row, n in zip(ids, lengths)]
        known = vocab.word_to_idx
        unk = words[vocab.unk_id]
        return cls(captions=captions, labels=rows, label_length=int(labels.max_length),
                   unk_captions={i: [[w if w in known else unk for w in c] for c in caps]
                                 for i, caps in captions.items()})

    @classmethod
    def from_captions(cls, captions: References, label_length: int) -> RewardReferences:
        """Without a vocabulary (every word kept): the labels are the captions clipped to ``label_length``."""
        clipped = {i: [list(c[:label_length]) for c in caps] for i, caps in captions.items()}
        return cls(captions=captions, labels=clipped, label_length=int(label_length), unk_captions=captions)


class ReferenceSet:
    """Tokenised references of many images, prepared once and never modified.

    * ``table``: every n-gram (orders 1-4) of the references and of the document
      frequencies, with dense ids; ``df_count[id]`` is its document frequency (0 if absent).
    * entries ``entry_ref``, ``entry_tf``: one per distinct n-gram of each reference sentence,
      grouped in runs (one run per distinct n-gram of an image: ``run_gid``, entries
      ``run_ptr[u]:run_ptr[u+1]``), runs sorted by n-gram id within each image (the runs
      of image slot ``s`` and order ``k`` are ``img_run_ptr[4s+k]:img_run_ptr[4s+k+1]``).
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
        rows = [flat[occ.first[k][:, None] + np.arange(k + 1)].astype(np.int32) for k in range(MAX_ORDER)]
        df_rows = list(df.ngrams[:MAX_ORDER]) if df is not None else []
        self.table = NgramTable(len(words), rows + df_rows)
        self.df_count = np.zeros(self.table.size, dtype=np.int32)
        self.num_documents = df.num_documents if df is not None else len(references)
        for df_r, df_c in zip(df_rows, df.counts if df is not None else []):
            self.df_count[self.table.lookup_rows(df_r)] = df_c
        gid = np.concatenate([self.table.lookup_rows(r) for r in rows])
        del rows
        ref = np.concatenate(occ.sentence)
        slot_of_ref = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        order = np.lexsort((ref, gid, slot_of_ref[ref]))
        gid, ref, slot = gid[order], ref[order], slot_of_ref[ref[order]]
        # runs: the references of one image that contain one n-gram
        run_start = np.flatnonzero(np.r_[len(gid) > 0, (gid[1:] != gid[:-1]) | (slot[1:] != slot[:-1])])  # none: all empty
        self.run_gid = gid[run_start].astype(np.int32)
        self.run_ptr = np.r_[run_start, len(gid)].astype(np.int64)
        # runs of (image slot s, order k) are img_run_ptr[4s+k]:img_run_ptr[4s+k+1]
        run_segment = slot[run_start] * MAX_ORDER + self.table.order_of[self.run_gid]
        self.img_run_ptr = np.searchsorted(run_segment, np.arange(len(counts) * MAX_ORDER + 1)).astype(np.int64)
        self.search_steps = max(1, int(np.diff(self.img_run_ptr).max(initial=0)).bit_length())
        self.entry_ref = ref.astype(np.int32)
        tf = np.concatenate(occ.count)[order]
        self.entry_tf = tf.astype(np.int16 if tf.max(initial=0) < 2**15 else np.int32)
        self.ref_len = lengths
        self._max_tf: np.ndarray | None = None

    def slots(self, image_ids: Sequence[int]) -> np.ndarray:
        """Slots of ``image_ids``; CaprlError naming the first id without references."""
        try:
            return np.fromiter((self.slot[int(i)] for i in image_ids), dtype=np.int64, count=len(image_ids))
        except KeyError as exc:
            raise CaprlError(f"image id {exc.args[0]} has no reference captions in this reward's references") from None

    def entry_gid(self) -> np.ndarray:
        """N-gram id of every entry (rebuilt on demand, to keep the set small)."""
        return np.repeat(self.run_gid, np.diff(self.run_ptr))

    def find_runs(self, slots: np.ndarray, orders: np.ndarray, gids: np.ndarray) -> np.ndarray:
        """Run index of n-gram ``gids[i]`` (of order ``orders[i]``+1) among the references of
        image slot ``slots[i]``, or -1."""
        segment = slots * MAX_ORDER + orders
        lo, hi = self.img_run_ptr[segment], self.img_run_ptr[segment + 1]
        return segment_search(self.run_gid, lo, hi, gids, self.search_steps)

    def max_tf(self) -> np.ndarray:
        """Per run, the largest term frequency among the image's references (BLEU's clip)."""
        if self._max_tf is None:
            tf = self.entry_tf
            self._max_tf = np.maximum.reduceat(tf, self.run_ptr[:-1]) if len(tf) else tf
        return self._max_tf

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
