"""Document frequencies: file round trip, bad files, annotations, the `caprl cider-df` stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caprl.errors import CaprlError
from caprl.rewards import (
    build_reward,
    compute_document_frequencies,
    load_document_frequencies,
    references_from_annotations,
    save_document_frequencies,
)

ANNOTATIONS = {
    "dataset": "tiny",
    "images": [
        {"id": 1, "file": "a.png", "split": "train", "captions": [["a", "red", "ball"], ["red", "ball"]], "raw": []},
        {"id": 2, "file": "b.png", "split": "train", "captions": [["a", "blue", "cube"]], "raw": []},
        {"id": 3, "file": "c.png", "split": "test", "captions": [["a", "red", "cube"]], "raw": []},
    ],
}


def test_references_from_annotations():
    assert references_from_annotations(ANNOTATIONS, "train") == {
        1: [["a", "red", "ball"], ["red", "ball"]],
        2: [["a", "blue", "cube"]],
    }
    assert list(references_from_annotations(ANNOTATIONS, "test")) == [3]
    with pytest.raises(CaprlError, match="images\\[0\\]"):
        references_from_annotations({"images": [{"id": 1}]}, "train")


def test_counts_one_per_document():
    df = compute_document_frequencies(references_from_annotations(ANNOTATIONS, "train")).to_dict()
    assert df[("red", "ball")] == 1  # twice in image 1, counted once
    assert df[("a",)] == 2
    assert df[("a", "red", "ball")] == 1 and ("a", "red", "cube") not in df


def test_round_trip(tmp_path):
    refs = references_from_annotations(ANNOTATIONS, "train")
    df = compute_document_frequencies(refs)
    path = tmp_path / "df.npz"
    save_document_frequencies(df, path)
    assert [p.name for p in tmp_path.iterdir()] == ["df.npz"]  # no temporary left behind
    loaded = load_document_frequencies(path)
    assert loaded.to_dict() == df.to_dict() and loaded.num_documents == 2
    caps = [["a", "red", "cube"]]
    np.testing.assert_array_equal(
        build_reward("cider_d", refs, loaded)([2], caps), build_reward("cider_d", refs, df)([2], caps)
    )


def test_bad_files(tmp_path):
    with pytest.raises(CaprlError, match="not found"):
        load_document_frequencies(tmp_path / "missing.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(CaprlError, match="garbage.npz"):
        load_document_frequencies(garbage)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.arange(3))
    with pytest.raises(CaprlError, match="not a caprl document-frequencies file"):
        load_document_frequencies(other)


def run_caprl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "caprl", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cider_df_stage(tmp_path):
    ann = tmp_path / "annotations.json"
    ann.write_text(json.dumps(ANNOTATIONS))
    out = tmp_path / "out" / "df.npz"
    done = run_caprl("cider-df", "--annotations", str(ann), "--split", "train", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert load_document_frequencies(out).num_documents == 2

    done = run_caprl("cider-df", "--annotations", str(ann), "--split", "val", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "no images in split 'val'" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [{"id": 1, "split": "train", "captions": "a b"}]}')
    done = run_caprl("cider-df", "--annotations", str(bad), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "bad.json" in done.stderr and "lists of tokens" in done.stderr


def test_json_format_round_trip_and_garbage(tmp_path):
    df = compute_document_frequencies(references_from_annotations(ANNOTATIONS, "train"))
    path = tmp_path / "cider_df.json"
    save_document_frequencies(df, path)
    assert json.loads(path.read_text())["format"] == "caprl-cider-df-v1"
    loaded = load_document_frequencies(path)
    assert loaded.to_dict() == df.to_dict() and loaded.words == df.words
    bad = tmp_path / "bad.json"
    doc = {"format": "caprl-cider-df-v1", "words": ["a"], "num_documents": 1, "ngrams": [[[3]]], "counts": [[1]]}
    bad.write_text(json.dumps(doc))
    with pytest.raises(CaprlError, match="bad.json: n-grams of order 1 hold word indices outside"):
        load_document_frequencies(bad)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(CaprlError, match="broken.json: malformed JSON"):
        load_document_frequencies(broken)
