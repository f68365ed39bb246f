"""CIDEr-D document frequencies of a reference corpus (``caprl cider-df``).

Each image is one document (as in pycocoevalcap's ``CiderScorer.compute_doc_freq``): the
document frequency of an n-gram (orders 1-4) is the number of images whose reference
captions contain it at least once. CIDEr-D's ``ref_len`` is ``log(num_documents)``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from caprl.data.annotations import references_from_annotations
from caprl.io import provenance
from caprl.errors import CaprlError
from caprl.io import atomic_path, read_json, write_text
from caprl.rewards.ngrams import MAX_ORDER, encode, sorted_unique

log = logging.getLogger(__name__)

FORMAT = "caprl-cider-df-v1"
References = Mapping[int, Sequence[Sequence[str]]]


@dataclass
class DocumentFrequencies:
    """Document frequencies of n-grams of orders 1..len(ngrams).

    ``ngrams[k-1]`` is an int32 matrix (m_k, k) of indices into ``words``; ``counts[k-1]``
    the number of documents containing each of those n-grams; ``num_documents`` the number
    of documents (images) of the corpus.
    """

    words: list[str]
    ngrams: list[np.ndarray]
    counts: list[np.ndarray]
    num_documents: int
    made_from: dict[str, str] = field(default_factory=dict)  # caprl.io.provenance.record of the annotations

    def to_dict(self) -> dict[tuple[str, ...], int]:
        """``{ngram tuple: count}``, the shape pycocoevalcap's ``document_frequency`` has."""
        out: dict[tuple[str, ...], int] = {}
        for rows, counts in zip(self.ngrams, self.counts):
            for row, count in zip(rows.tolist(), counts.tolist()):
                out[tuple(self.words[i] for i in row)] = int(count)
        return out


def compute_document_frequencies(references: References, max_order: int = MAX_ORDER) -> DocumentFrequencies:
    """Document frequencies over ``references`` (image id -> tokenised reference captions)."""
    words = sorted({w for refs in references.values() for ref in refs for w in ref})
    index = {w: i for i, w in enumerate(words)}
    sentences = [list(ref) for refs in references.values() for ref in refs]
    doc_of_sentence = np.repeat(
        np.arange(len(references), dtype=np.int64), [len(refs) for refs in references.values()]
    )
    flat, lengths, _ = encode(sentences, index)
    ends = np.cumsum(lengths)
    sent_of_word = np.repeat(np.arange(len(sentences), dtype=np.int64), lengths)
    left = ends[sent_of_word] - np.arange(len(flat))  # words left in the sentence
    n_docs = max(len(references), 1)
    pos = np.arange(len(flat), dtype=np.int64)
    ids = flat
    ngrams, counts = [], []
    for k in range(1, max_order + 1):
        if k > 1:  # id of an order-k n-gram = rank of (id of its prefix, last word)
            keep = left[pos] >= k
            pos = pos[keep]
            ids = ids[keep] * max(len(words), 1) + flat[pos + k - 1]
        uniq, first, ids = np.unique(ids, return_index=True, return_inverse=True)
        ids = ids.reshape(-1).astype(np.int64)
        pairs = sorted_unique(ids * n_docs + doc_of_sentence[sent_of_word[pos]])
        ngrams.append(flat[pos[first][:, None] + np.arange(k)].astype(np.int32))
        counts.append(np.bincount(pairs // n_docs, minlength=len(uniq)).astype(np.int32))
    return DocumentFrequencies(words, ngrams, counts, len(references))


def save_document_frequencies(df: DocumentFrequencies, path: str | os.PathLike[str]) -> None:
    """Write ``df`` atomically: compressed ``.npz`` (no pickles) unless ``path`` ends in ``.json``.

    npz layout: ``format`` = "caprl-cider-df-v1"; ``words`` (unicode array, the word list);
    ``num_documents`` (int64 scalar); for k = 1..4 ``ngrams_k`` (int32, shape (m_k, k): word
    indices of each n-gram of order k) and ``counts_k`` (int32, shape (m_k,): the number of
    images whose references contain that n-gram).
    JSON layout: ``{"format", "num_documents", "words": [str], "ngrams": [per order k:
    [[word index, ...k], ...]], "counts": [per order k: [int, ...]]}`` (same contents).
    """
    if Path(path).suffix.lower() == ".json":
        doc = {
            "format": FORMAT,
            "num_documents": int(df.num_documents),
            "words": list(df.words),
            "ngrams": [rows.tolist() for rows in df.ngrams],
            "counts": [c.tolist() for c in df.counts],
            "made_from": dict(df.made_from),
        }
        write_text(path, json.dumps(doc, separators=(",", ":")) + "\n")
        return
    arrays: dict[str, Any] = {
        "format": np.array(FORMAT),
        "words": np.array(df.words, dtype=str),
        "num_documents": np.array(df.num_documents, dtype=np.int64),
        "made_from": np.array(json.dumps(dict(df.made_from))),
    }
    for k, (rows, counts) in enumerate(zip(df.ngrams, df.counts), start=1):
        arrays[f"ngrams_{k}"] = rows
        arrays[f"counts_{k}"] = counts
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)


def load_document_frequencies(path: str | os.PathLike[str]) -> DocumentFrequencies:
    """Read a file written by :func:`save_document_frequencies` (npz or JSON, told apart by
    content); CaprlError naming the file if it is not one."""
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"document frequencies file not found: {p} (run `caprl cider-df`)")
    with open(p, "rb") as fh:
        is_zip = fh.read(2) == b"PK"
    try:
        fields = _read_npz(p) if is_zip else _read_json(p)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CaprlError(f"{p}: cannot read document frequencies: {exc}") from exc
    if fields.get("format") != FORMAT:
        raise CaprlError(f"{p}: not a caprl document-frequencies file (expected format {FORMAT})")
    words = [str(w) for w in fields["words"]]
    ngrams, counts = [], []
    for k, (rows, cnt) in enumerate(zip(fields["ngrams"], fields["counts"]), start=1):
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, k)
        cnt = np.asarray(cnt, dtype=np.int64)
        if cnt.shape != (rows.shape[0],):
            raise CaprlError(f"{p}: n-grams and counts of order {k} have different lengths")
        if rows.size and (rows.min() < 0 or rows.max() >= len(words)):
            raise CaprlError(f"{p}: n-grams of order {k} hold word indices outside the word list")
        ngrams.append(rows.astype(np.int32))
        counts.append(cnt.astype(np.int32))
    num_documents = int(fields["num_documents"])
    if not ngrams or num_documents < 1:
        raise CaprlError(f"{p}: document frequencies are empty")
    made_from = fields.get("made_from") or {}
    return DocumentFrequencies(words, ngrams, counts, num_documents, {str(k): str(v) for k, v in made_from.items()})


def _read_npz(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as data:
        fields: dict[str, Any] = {"format": str(data["format"]) if "format" in data else None}
        if fields["format"] != FORMAT:
            return fields
        k = 1
        fields.update(words=data["words"].tolist(), num_documents=int(data["num_documents"]), ngrams=[], counts=[],
                      made_from=json.loads(str(data["made_from"])) if "made_from" in data else {})
        while f"ngrams_{k}" in data:
            fields["ngrams"].append(data[f"ngrams_{k}"])
            fields["counts"].append(data[f"counts_{k}"])
            k += 1
    return fields


def _read_json(path: Path) -> dict[str, Any]:
    doc = read_json(path, "document frequencies file")
    if not isinstance(doc, dict):
        return {"format": None}
    return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--annotations", required=True, help="normalised annotations JSON (from `caprl prepare`)")
    parser.add_argument("--split", default="train", help="split whose references make the corpus (default: train)")
    parser.add_argument("--out", required=True, help="output file: .npz (compact) or .json")


def main(args: argparse.Namespace) -> None:
    annotations = read_json(args.annotations, "annotations file")
    try:
        refs = references_from_annotations(annotations, args.split)
    except CaprlError as exc:
        raise CaprlError(f"{args.annotations}: {exc}") from exc
    if not refs:
        raise CaprlError(f"{args.annotations}: no images in split '{args.split}'")
    df = compute_document_frequencies(refs)
    df.made_from = provenance.record(annotations)
    save_document_frequencies(df, args.out)
    sizes = ", ".join(f"{len(c)} {k + 1}-grams" for k, c in enumerate(df.counts))
    log.info("document frequencies of %d images (%s) -> %s", df.num_documents, sizes, args.out)
