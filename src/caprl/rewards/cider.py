"""CIDEr-D, vectorised: pycocoevalcap's ``CiderScorer`` semantics with corpus document frequencies.

Per candidate c and reference r of its image, for each n-gram order n (1-4), with
``idf(g) = log(N) - log(max(1, df(g)))`` (N documents of the df corpus) and tf-idf vectors
``v(g) = tf(g) * idf(g)``::

    sim_n(c, r) = sum_g min(v_c(g), v_r(g)) * v_r(g) / (|v_c|_n * |v_r|_n)
                  * exp(-(len_c - len_r)^2 / (2 sigma^2))
    CIDEr-D(c)  = 10 * mean_n( sum_r sim_n(c, r) ) / num_refs

where lengths are the number of bigrams (what ``CiderScorer.counts2vec`` counts) and a
zero norm leaves the dot product undivided, exactly as pycocoevalcap does.

:class:`EndOfCaption` counts the end of a caption as a word: self-critical.pytorch's reward text
(``captioning/utils/rewards.py`` ``array_to_str`` writes each sampled caption and each reference
with the end token 0 where it has one, ``scripts/prepro_ngrams.py`` appends ``<eos>`` to every
caption of the document-frequency corpus), as the authors' code of papers 000 and 004 has it
(gujiuxiang/Stack-Captioning and ruotianluo/DiscCaptioning, ``misc/rewards.py`` ``array_to_str``).
A caption that stops mid-phrase then loses the reference's "last word, end" n-grams. The references
are SCP's ``data['gts']``: the label arrays, clipped to ``seq_length`` by ``prepro_labels.py`` and
zero-padded, so a label as long as the array has no end (:class:`EndToken`). Rennie et al. (2017)
do not say; their code's practice decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.base import Reward
from caprl.rewards.document_frequencies import DocumentFrequencies, compute_document_frequencies
from caprl.rewards.references import ReferenceSet, expand_ranges

ORDERS = 4
END = "<eos>"  # the vocabulary's index 0 (caprl.data.vocab.EOS): no caption word can equal it


class CiderD(Reward):
    """CIDEr-D reward; reference tf-idf vectors and norms are built once, in ``__init__``."""

    name = "cider_d"

    def __init__(self, references: ReferenceSet, sigma: float = 6.0) -> None:
        self.refs = references
        self.sigma = float(sigma)
        self.log_docs = float(np.log(float(references.num_documents)))
        # idf of every table n-gram, plus a last slot (index -1) for n-grams not in the table
        self.idf = np.append(self.log_docs - np.log(np.maximum(1.0, references.df_count)), self.log_docs)
        entry_gid = references.entry_gid()
        values = references.entry_tf * self.idf[entry_gid]
        orders = references.table.order_of[entry_gid].astype(np.int64)
        n_refs = len(references.ref_len)
        norm2 = np.bincount(references.entry_ref * ORDERS + orders, values * values, minlength=n_refs * ORDERS)
        self.ref_norm = np.sqrt(norm2).reshape(n_refs, ORDERS)
        self.ref_bigrams = np.maximum(references.ref_len - 1, 0).astype(np.float64)

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        """CIDEr-D of each caption against the references of its image (float64 array)."""
        self.check_batch(image_ids, captions)
        refs = self.refs
        slots = refs.slots(image_ids)
        batch = len(captions)
        if batch == 0:
            return np.zeros(0)
        cap, order, gid, tf, lengths = refs.candidate_ngrams(captions)
        cand_val = tf * self.idf[gid]
        cand_norm = np.sqrt(
            np.bincount(cap * ORDERS + order, cand_val * cand_val, minlength=batch * ORDERS)
        ).reshape(batch, ORDERS)
        # (candidate, reference) pairs: the references of each candidate's image
        pair_lo, pair_hi = refs.ref_ptr[slots], refs.ref_ptr[slots + 1]
        pair_cap, pair_ref = expand_ranges(pair_lo, pair_hi)
        pair_start = np.cumsum(pair_hi - pair_lo) - (pair_hi - pair_lo)
        # clipped dot products: candidate n-grams that occur in the image's references
        seen = np.flatnonzero(gid >= 0)
        run = refs.find_runs(slots[cap[seen]], order[seen], gid[seen])
        seen, run = seen[run >= 0], run[run >= 0]
        owner, entry = expand_ranges(refs.run_ptr[run], refs.run_ptr[run + 1])
        c_idx = seen[owner]
        r_val = refs.entry_tf[entry] * self.idf[gid[c_idx]]
        contrib = np.minimum(cand_val[c_idx], r_val) * r_val
        c_of = cap[c_idx]
        pair = pair_start[c_of] + (refs.entry_ref[entry] - pair_lo[c_of])
        n_pairs = len(pair_cap)
        dots = np.bincount(pair * ORDERS + order[c_idx], contrib, minlength=n_pairs * ORDERS).reshape(n_pairs, ORDERS)
        denom = cand_norm[pair_cap] * self.ref_norm[pair_ref]
        sims = dots / np.where(denom != 0, denom, 1.0)  # a zero norm leaves the dot product as is
        delta = np.maximum(lengths - 1, 0)[pair_cap] - self.ref_bigrams[pair_ref]
        sims *= np.power(np.e, -(delta * delta) / (2 * self.sigma**2))[:, None]
        per_order = np.add.reduceat(sims, pair_start, axis=0)  # pairs are grouped by candidate
        return per_order.mean(axis=1) / (pair_hi - pair_lo) * 10.0


def ended(captions: Sequence[Sequence[str]], max_length: int) -> list[list[str]]:
    """Each caption with :data:`END` appended where it ended: shorter than ``max_length`` words
    (a decode that ran to ``max_length`` never emitted its end, as in self-critical.pytorch)."""
    return [[*c, END] if len(c) < max_length else list(c) for c in captions]


@dataclass(frozen=True)
class EndToken:
    """Where the end counts as a word (SCP's ``array_to_str``): after a sampled caption shorter than
    ``candidate_length`` (the decode's limit: one that ran to it never emitted its end) and after a
    reference shorter than ``reference_length`` (the label arrays' width, ``vocab.max_length``: a
    label row as wide as the array holds no 0). ``corpus``: the captions whose documents, each with
    the end, give CIDEr-D's document frequencies (``prepro_ngrams.py``: every full training caption,
    rare words UNK); None: the references."""

    candidate_length: int
    reference_length: int
    corpus: Mapping[int, Sequence[Sequence[str]]] | None = None


def ended_references(references: Mapping[int, Sequence[Sequence[str]]], end: EndToken,
                     document_frequencies: DocumentFrequencies | None) -> ReferenceSet:
    """References with the end counted (:class:`EndToken`) over document frequencies of
    ``end.corpus`` (else the references) with ``<eos>`` after every caption (``prepro_ngrams.py``).
    The frequencies are recomputed; ``document_frequencies`` (the corpus ``caprl cider-df`` counts,
    the training split's references) is checked to count as many documents."""
    corpus = references if end.corpus is None else end.corpus
    df = compute_document_frequencies({i: [[*r, END] for r in refs] for i, refs in corpus.items()})
    if document_frequencies is not None and document_frequencies.num_documents != df.num_documents:
        raise CaprlError(f"CIDEr-D with end tokens: the document frequencies count {document_frequencies.num_documents} "
                         f"images, the reward's references {df.num_documents}; they must be one corpus "
                         "(`caprl cider-df --split train`)")
    return ReferenceSet(ended_map(references, end.reference_length), df)


def ended_map(references: Mapping[int, Sequence[Sequence[str]]],
              reference_length: int) -> dict[int, list[list[str]]]:
    """Every image's references with the end where they have it (:func:`ended`)."""
    return {i: ended(refs, reference_length) for i, refs in references.items()}


class EndOfCaption(Reward):
    """A reward of the captions with their end counted as a word (the module's docstring): ``inner``
    was built on references with the end (:func:`ended_references`)."""

    def __init__(self, inner: Reward, candidate_length: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.candidate_length = int(candidate_length)

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        self.check_batch(image_ids, captions)
        return self.inner(image_ids, ended(captions, self.candidate_length))

    def close(self) -> None:
        self.inner.close()
