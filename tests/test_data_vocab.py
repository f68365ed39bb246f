"""Vocabulary and HDF5 labels: min_count, clipping, UNK, the documented layout, readers."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from caprl.data import vocab as V
from caprl.errors import CaprlError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "params.schema.yaml"
LONG = [f"w{i}" for i in range(20)]


def annotations() -> dict:
    """'cat' x5 and 'dog' x4 in train; 'bird' x9 only in val; a 20-token and a 16-token caption."""
    return {"dataset": "toy", "images": [
        {"id": 3, "file": "a.png", "split": "train", "raw": ["r"] * 3,
         "captions": [["cat", "dog"], ["cat", "cat", "dog"], ["cat", "dog", "dog"]]},
        {"id": 8, "file": "b.png", "split": "train", "raw": ["r"] * 2,
         "captions": [["cat", "a"] + LONG, ["a"] * 16]},
        {"id": 9, "file": "c.png", "split": "val", "raw": ["r"], "captions": [["bird"] * 9]},
        {"id": 11, "file": "d.png", "split": "test", "raw": ["r", "r"], "captions": [["cat", "fish"], ["dog"]]},
    ]}


def test_min_count_keeps_words_seen_at_least_min_count_times_in_train() -> None:
    vocab = V.build_vocab(annotations(), min_count=5, max_length=16)
    # a: 17, cat: 5 (kept, == min_count), dog: 4 (dropped), bird: val only, w*: once each
    assert vocab.idx_to_word == ["<eos>", "a", "cat", "UNK"]
    assert V.build_vocab(annotations(), min_count=4, max_length=16).idx_to_word == ["<eos>", "a", "cat", "dog", "UNK"]
    assert len(V.build_vocab(annotations(), min_count=1, max_length=16)) == 1 + 3 + 20 + 1


def test_encode_decode_and_unk() -> None:
    vocab = V.build_vocab(annotations(), min_count=4, max_length=16)
    assert vocab.encode(["cat", "zebra", "dog"]) == [2, vocab.unk_id, 3]
    assert vocab.unk_id == 4 and vocab.eos_id == 0
    assert vocab.decode([2, 3, 4, 0, 1, 1]) == ["cat", "dog", "UNK"]
    assert vocab.decode(np.array([1, 2], dtype=np.int32)) == ["a", "cat"]


def test_labels_clip_pad_and_unk() -> None:
    vocab = V.build_vocab(annotations(), min_count=5, max_length=16)
    arrays = V.encode_labels(annotations(), vocab)
    assert arrays["labels"].shape == (8, 16) and arrays["labels"].dtype == np.int32
    assert arrays["label_length"].tolist() == [2, 3, 3, 16, 16, 9, 2, 1]
    long_row = arrays["labels"][3]
    assert long_row.tolist() == [2, 1] + [vocab.unk_id] * 14  # 22 tokens clipped to 16, w* -> UNK
    assert arrays["labels"][4].tolist() == [1] * 16  # exactly 16: not clipped
    assert arrays["labels"][0].tolist() == [2, vocab.unk_id] + [0] * 14  # 0-padded
    assert arrays["label_start"].tolist() == [0, 3, 5, 6] and arrays["label_end"].tolist() == [3, 5, 6, 8]
    assert arrays["split"].tolist() == [0, 0, 1, 2]
    assert arrays["image_ids"].tolist() == [3, 8, 9, 11]


def _documented_layout() -> dict[str, tuple[str, int]]:
    """name -> (dtype, rank) parsed from write_labels' docstring."""
    rows = re.findall(r"^\s+(\w+)\s+(int\d+)\s+\[([^\]]+)\]", V.write_labels.__doc__ or "", flags=re.M)
    return {name: (dtype, len(shape.split(","))) for name, dtype, shape in rows}


def test_hdf5_layout_matches_docstring(tmp_path: Path) -> None:
    vocab = V.build_vocab(annotations(), min_count=5, max_length=16)
    V.write_labels(tmp_path / "labels.h5", V.encode_labels(annotations(), vocab), vocab)
    documented = _documented_layout()
    assert set(documented) == set(V.LABEL_DATASETS)
    with h5py.File(tmp_path / "labels.h5", "r") as f:
        assert set(f.keys()) == set(documented)
        for name, (dtype, rank) in documented.items():
            assert f[name].dtype == np.dtype(dtype), name
            assert f[name].ndim == rank, name
        assert f.attrs["vocab_sha256"] == vocab.sha256
        assert int(f.attrs["max_length"]) == 16
        n = len(f["image_ids"])
        assert (f["label_end"][()] > f["label_start"][()]).all() and f["label_end"][n - 1] == len(f["labels"])
    assert [p.name for p in tmp_path.iterdir()] == ["labels.h5"]


def test_labels_reader(tmp_path: Path) -> None:
    vocab = V.build_vocab(annotations(), min_count=4, max_length=16)
    V.write_labels(tmp_path / "labels.h5", V.encode_labels(annotations(), vocab), vocab)
    labels = V.Labels(tmp_path / "labels.h5")
    assert len(labels) == 4 and labels.max_length == 16
    assert labels.image_ids("train").tolist() == [3, 8] and labels.image_ids("test").tolist() == [11]
    assert labels.image_ids().tolist() == [3, 8, 9, 11] and labels.image_ids("val").tolist() == [9]
    with pytest.raises(CaprlError, match="unknown split 'dev'"):
        labels.image_ids("dev")
    caps = labels.captions(11)
    assert caps.shape == (2, 16)
    assert [vocab.decode(c) for c in caps] == [["cat", "UNK"], ["dog"]]
    assert labels.lengths(11).tolist() == [2, 1]
    labels.check_vocab(vocab)
    with pytest.raises(CaprlError, match="another vocabulary"):
        labels.check_vocab(V.build_vocab(annotations(), min_count=5, max_length=16))
    with pytest.raises(CaprlError, match="no labels for image id 4"):
        labels.captions(4)
    with pytest.raises(CaprlError, match="not found"):
        V.Labels(tmp_path / "missing.h5")
    (tmp_path / "corrupt.h5").write_bytes(b"not hdf5")
    with pytest.raises(CaprlError, match="corrupt.h5"):
        V.Labels(tmp_path / "corrupt.h5")


def test_vocab_file_round_trip_and_hash(tmp_path: Path) -> None:
    vocab = V.build_vocab(annotations(), min_count=4, max_length=16)
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(vocab.to_json()))
    loaded = V.Vocab.load(path)
    assert loaded.idx_to_word == vocab.idx_to_word and loaded.sha256 == vocab.sha256
    assert loaded.min_count == 4 and loaded.max_length == 16
    assert V.vocab_hash(["<eos>", "a", "b", "UNK"]) != V.vocab_hash(["<eos>", "b", "a", "UNK"])
    edited = vocab.to_json()
    edited["idx_to_word"][1:3] = edited["idx_to_word"][2:0:-1]
    path.write_text(json.dumps(edited))
    with pytest.raises(CaprlError, match="sha256 does not match"):
        V.Vocab.load(path)
    path.write_text(json.dumps({"idx_to_word": ["a", "UNK"], "min_count": 1, "max_length": 2, "sha256": ""}))
    with pytest.raises(CaprlError, match="invalid idx_to_word"):
        V.Vocab.load(path)


def _main_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    monkeypatch.setenv("CAPRL_PARAMS_SCHEMA", str(SCHEMA))
    (tmp_path / "ann.json").write_text(json.dumps(annotations()))
    return argparse.Namespace(params=REPO / "params.yaml", annotations=tmp_path / "ann.json",
                              out_vocab=tmp_path / "out" / "vocab.json", out_labels=tmp_path / "out" / "labels.h5")


def test_main_with_default_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _main_args(tmp_path, monkeypatch)
    V.main(args)
    vocab = V.Vocab.load(args.out_vocab)
    assert vocab.idx_to_word == ["<eos>", "a", "cat", "UNK"]  # params vocab.min_count = 5
    labels = V.Labels(args.out_labels)
    labels.check_vocab(vocab)
    assert labels.labels.shape == (8, 16)


def test_main_failure_mid_write_keeps_old_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _main_args(tmp_path, monkeypatch)
    args.out_labels.parent.mkdir()
    args.out_labels.write_bytes(b"old labels")
    real = h5py.Group.create_dataset
    calls = []

    def fail_on_third(self, name, *a, **kw):
        calls.append(name)
        if len(calls) == 3:
            raise OSError("killed mid-write")
        return real(self, name, *a, **kw)

    monkeypatch.setattr(h5py.Group, "create_dataset", fail_on_third)
    with pytest.raises(OSError):
        V.main(args)
    assert args.out_labels.read_bytes() == b"old labels"
    assert [p.name for p in args.out_labels.parent.iterdir()] == ["labels.h5"]
