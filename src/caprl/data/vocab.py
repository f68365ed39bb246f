"""``caprl vocab``: the vocabulary and the HDF5 label file, from the normalised annotations.

Vocabulary: words seen at least ``min_count`` times in the TRAIN captions (sorted by
count, then alphabetically); everything else maps to ``UNK``. ``min_count`` and ``max_length``
come from params.yaml ``vocab:``, overridden per dataset by ``datasets.<name>.vocab``. Index 0 is ``<eos>``: the
end-of-caption token, the padding, and the start token fed to the decoder. ``vocab.json``::

    {"idx_to_word": ["<eos>", w1, ..., "UNK"], "min_count": int, "max_length": int,
     "sha256": sha256 of idx_to_word (see ``vocab_hash``)}

The label layout is documented in :func:`write_labels`; :class:`Vocab` and :class:`Labels`
read the two files back.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable, Sequence

import h5py
import numpy as np

from caprl import io, params as params_mod
from caprl.io import provenance
from caprl.data import SPLITS
from caprl.data.annotations import load_annotations
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

EOS = "<eos>"
UNK = "UNK"
SPLIT_CODES = {split: code for code, split in enumerate(SPLITS)}  # train 0, val 1, test 2
LABEL_DATASETS = ("image_ids", "split", "label_start", "label_end", "labels", "label_length")


def vocab_hash(idx_to_word: Sequence[str]) -> str:
    """sha256 of the compact UTF-8 JSON list of words: identifies a vocabulary exactly."""
    text = json.dumps(list(idx_to_word), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Vocab:
    """Word <-> index mapping; index 0 is ``<eos>`` (end, padding and start), the last is ``UNK``."""

    eos_id = 0

    def __init__(self, idx_to_word: Sequence[str], min_count: int, max_length: int) -> None:
        words = list(idx_to_word)
        if len(words) < 2 or words[0] != EOS or words[-1] != UNK:
            raise ValueError(f"idx_to_word must start with {EOS!r} and end with {UNK!r}")
        if len(set(words)) != len(words):
            raise ValueError("idx_to_word has repeated words")
        self.idx_to_word = words
        self.word_to_idx = {w: i for i, w in enumerate(words)}
        self.min_count = int(min_count)
        self.max_length = int(max_length)

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        p = Path(path)
        data = io.read_json(p, what="vocabulary file (made by `caprl vocab`)")
        if not isinstance(data, dict):
            raise CaprlError(f"{p}: not a vocabulary file; rerun `caprl vocab`")
        for key in ("idx_to_word", "min_count", "max_length", "sha256"):
            if key not in data:
                raise CaprlError(f"{p}: missing key '{key}'; rerun `caprl vocab`")
        try:
            vocab = cls(data["idx_to_word"], data["min_count"], data["max_length"])
        except (ValueError, TypeError) as exc:
            raise CaprlError(f"{p}: invalid idx_to_word: {exc}; rerun `caprl vocab`") from exc
        if vocab.sha256 != data["sha256"]:
            raise CaprlError(f"{p}: sha256 does not match idx_to_word (file edited or corrupt); rerun `caprl vocab`")
        return vocab

    def __len__(self) -> int:
        return len(self.idx_to_word)

    @property
    def unk_id(self) -> int:
        return len(self.idx_to_word) - 1

    @property
    def sha256(self) -> str:
        return vocab_hash(self.idx_to_word)

    def encode(self, words: Iterable[str]) -> list[int]:
        return [self.word_to_idx.get(w, self.unk_id) for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words up to (not including) the first 0."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            words.append(self.idx_to_word[i])
        return words

    def to_json(self) -> dict[str, Any]:
        return {"idx_to_word": self.idx_to_word, "min_count": self.min_count,
                "max_length": self.max_length, "sha256": self.sha256}


def build_vocab(annotations: dict[str, Any], min_count: int, max_length: int) -> Vocab:
    """Words with at least ``min_count`` occurrences in the train captions (full length)."""
    counts: collections.Counter[str] = collections.Counter()
    for image in annotations["images"]:
        if image["split"] == "train":
            for caption in image["captions"]:
                counts.update(caption)
    if not counts:
        raise CaprlError("no training captions in the annotations: cannot build a vocabulary")
    kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    n_unk = sum(c for w, c in counts.items() if c < min_count)
    log.info(
        "vocabulary: %d of %d train words seen >= %d times; %d train tokens (%.2f%%) become UNK",
        len(kept), len(counts), min_count, n_unk, 100.0 * n_unk / sum(counts.values()),
    )
    return Vocab([EOS, *kept, UNK], min_count, max_length)


def encode_labels(annotations: dict[str, Any], vocab: Vocab) -> dict[str, np.ndarray]:
    """Arrays of the label file (see :func:`write_labels`), images in annotation order."""
    max_length = vocab.max_length
    images = annotations["images"]
    n_captions = sum(len(im["captions"]) for im in images)
    labels = np.zeros((n_captions, max_length), dtype=np.int32)
    lengths = np.zeros(n_captions, dtype=np.int32)
    starts = np.zeros(len(images), dtype=np.int64)
    ends = np.zeros(len(images), dtype=np.int64)
    row = clipped = 0
    for i, image in enumerate(images):
        starts[i] = row
        for caption in image["captions"]:
            ids = vocab.encode(caption[:max_length])
            clipped += len(caption) > max_length
            labels[row, : len(ids)] = ids
            lengths[row] = len(ids)
            row += 1
        ends[i] = row
    log.info("%d of %d captions clipped to %d tokens", clipped, n_captions, max_length)
    return {
        "image_ids": np.array([im["id"] for im in images], dtype=np.int64),
        "split": np.array([SPLIT_CODES[im["split"]] for im in images], dtype=np.int8),
        "label_start": starts,
        "label_end": ends,
        "labels": labels,
        "label_length": lengths,
    }


def write_labels(path: str | Path, arrays: dict[str, np.ndarray], vocab: Vocab,
                 made_from: dict[str, str] | None = None) -> None:
    """Write the label HDF5 atomically. Layout (N images, M captions, L = max_length)::

        image_ids     int64 [N]     image ids, in the annotations' order (sorted by id)
        split         int8  [N]     0 train, 1 val, 2 test
        label_start   int64 [N]     first row of the image's captions in ``labels``
        label_end     int64 [N]     one past its last row (exclusive)
        labels        int32 [M, L]  word ids (see vocab.json), clipped to L, 0-padded
        label_length  int32 [M]     tokens before the padding (1..L)
        attrs: vocab_sha256 (str), max_length (int), and what ``made_from`` records of the
               annotations (dataset, annotations_sha: :func:`caprl.io.provenance.record`)
    """
    with io.atomic_hdf5(path) as f:
        for name in LABEL_DATASETS:
            f.create_dataset(name, data=arrays[name])
        f.attrs["vocab_sha256"] = vocab.sha256
        f.attrs["max_length"] = vocab.max_length
        f.attrs.update(made_from or {})


class Labels:
    """The label HDF5 file, read fully into memory (small; safe to share with worker processes)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.exists():
            raise CaprlError(f"labels file not found: {p} (made by `caprl vocab`)")
        try:
            with h5py.File(p, "r") as f:
                missing = [name for name in LABEL_DATASETS if name not in f]
                if missing:
                    raise CaprlError(f"{p}: missing dataset(s) {', '.join(missing)}; rerun `caprl vocab`")
                arrays = {name: f[name][()] for name in LABEL_DATASETS}
                self.vocab_sha256 = str(f.attrs["vocab_sha256"])
                self.max_length = int(f.attrs["max_length"])
                self.attrs = {k: str(f.attrs[k]) for k in ("dataset", "annotations_sha") if k in f.attrs}
        except (OSError, KeyError) as exc:
            raise CaprlError(f"{p}: unreadable label file ({exc}); rerun `caprl vocab`") from exc
        self.path = p
        self.all_image_ids: np.ndarray = arrays["image_ids"]
        self.split_codes: np.ndarray = arrays["split"]
        self.label_start: np.ndarray = arrays["label_start"]
        self.label_end: np.ndarray = arrays["label_end"]
        self.labels: np.ndarray = arrays["labels"]
        self.label_length: np.ndarray = arrays["label_length"]
        self._row = {int(image_id): i for i, image_id in enumerate(self.all_image_ids)}

    def __len__(self) -> int:
        return len(self.all_image_ids)

    def check_vocab(self, vocab: Vocab) -> None:
        if vocab.sha256 != self.vocab_sha256:
            raise CaprlError(
                f"{self.path} was made with another vocabulary (sha256 {self.vocab_sha256[:12]}..., "
                f"given {vocab.sha256[:12]}...); rerun `caprl vocab`"
            )

    def image_ids(self, split: str | None = None) -> np.ndarray:
        """Image ids of one split (all images if None), in file order (sorted by id)."""
        if split is None:
            return self.all_image_ids
        if split not in SPLIT_CODES:
            raise CaprlError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return self.all_image_ids[self.split_codes == SPLIT_CODES[split]]

    def index(self, image_id: int) -> int:
        try:
            return self._row[int(image_id)]
        except KeyError:
            raise CaprlError(f"{self.path}: no labels for image id {image_id}") from None

    def captions(self, image_id: int) -> np.ndarray:
        """int32 [n_captions, max_length], 0-padded."""
        i = self.index(image_id)
        return self.labels[self.label_start[i] : self.label_end[i]]

    def lengths(self, image_id: int) -> np.ndarray:
        i = self.index(image_id)
        return self.label_length[self.label_start[i] : self.label_end[i]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--annotations", required=True, type=Path, help="annotations JSON from `caprl prepare`")
    parser.add_argument("--out-vocab", required=True, type=Path, help="vocab.json to write")
    parser.add_argument("--out-labels", required=True, type=Path, help="labels HDF5 to write")


def vocab_settings(params: dict[str, Any], annotations: dict[str, Any], source: Path) -> dict[str, Any]:
    """``min_count`` and ``max_length`` for the annotations' dataset (its ``"dataset"``, the name
    under ``datasets:`` that ``caprl prepare`` wrote): :func:`caprl.params.dataset_vocab`; the
    top-level ``vocab:`` section for a dataset params.yaml does not define."""
    name = annotations["dataset"]
    if name in params["datasets"]:
        return params_mod.dataset_vocab(params, name)
    log.info("%s: dataset %r is not under datasets: in params.yaml; using the top-level vocab: settings",
             source, name)
    return dict(params["vocab"])


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    annotations = load_annotations(args.annotations)
    settings = vocab_settings(params, annotations, args.annotations)
    vocab = build_vocab(annotations, settings["min_count"], settings["max_length"])
    arrays = encode_labels(annotations, vocab)
    write_labels(args.out_labels, arrays, vocab, provenance.record(annotations))
    io.write_json(args.out_vocab, vocab.to_json(), indent=1)
    log.info("wrote %s (%d entries incl. %s and %s) and %s (%d captions)",
             args.out_vocab, len(vocab), EOS, UNK, args.out_labels, len(arrays["labels"]))
