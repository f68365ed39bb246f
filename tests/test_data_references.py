"""COCO-format references of a split, and the whole data chain through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import yaml

from caprl.data.references import build_references
from caprl.errors import CaprlError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "params.schema.yaml"


def annotations() -> dict:
    return {"dataset": "toy", "images": [
        {"id": 7, "file": "a.png", "split": "test", "captions": [["a", "b"], ["c"]], "raw": ["A b.", "C!"]},
        {"id": 2, "file": "b.png", "split": "train", "captions": [["x"]], "raw": ["X."]},
        {"id": 4, "file": "c.png", "split": "test", "captions": [["d"]], "raw": ["D, really."]},
    ]}


def test_references_in_coco_caption_format() -> None:
    refs = build_references(annotations(), "test")
    assert set(refs) == {"info", "licenses", "type", "images", "annotations"}
    assert refs["type"] == "captions" and refs["licenses"] == []
    assert refs["images"] == [{"id": 4}, {"id": 7}]
    assert refs["annotations"] == [
        {"image_id": 4, "id": 0, "caption": "D, really."},
        {"image_id": 7, "id": 1, "caption": "A b."},
        {"image_id": 7, "id": 2, "caption": "C!"},
    ]
    with pytest.raises(CaprlError, match="no 'val' images"):
        build_references(annotations(), "val")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(SCHEMA)}
    cmd = [sys.executable, "-m", "caprl", *args, "--params", str(cwd / "params.yaml")]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_data_chain_through_the_cli(tmp_path: Path) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["synthetic"].update({"n_train": 40, "n_val": 5, "n_test": 5})
    params["vocab"]["min_count"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    steps = [
        ["synthesize", "--dataset", "synthetic", "--out-json", "raw/d.json", "--image-dir", "raw/images"],
        ["prepare", "--dataset", "synthetic", "--raw", "raw/d.json", "--media-root", "raw/images",
         "--out", "data/annotations.json"],
        ["vocab", "--annotations", "data/annotations.json", "--out-vocab", "data/vocab.json",
         "--out-labels", "data/labels.h5"],
        ["references", "--annotations", "data/annotations.json", "--split", "test", "--out", "data/refs_test.json"],
    ]
    for step in steps:
        result = run(step, tmp_path)
        assert result.returncode == 0, result.stderr
    ann = json.loads((tmp_path / "data" / "annotations.json").read_text())
    refs = json.loads((tmp_path / "data" / "refs_test.json").read_text())
    vocab = json.loads((tmp_path / "data" / "vocab.json").read_text())
    test_ids = [im["id"] for im in ann["images"] if im["split"] == "test"]
    assert [im["id"] for im in refs["images"]] == test_ids and len(refs["annotations"]) == 25
    assert vocab["idx_to_word"][0] == "<eos>" and vocab["idx_to_word"][-1] == "UNK"
    with h5py.File(tmp_path / "data" / "labels.h5", "r") as f:
        assert f["image_ids"][()].tolist() == [im["id"] for im in ann["images"]]
        assert f.attrs["vocab_sha256"] == vocab["sha256"]


SHARED_COCO = (REPO / ".." / "shared" / "data" / "coco").resolve()


@pytest.mark.skipif(not (SHARED_COCO / "karpathy_test5k_captions.json").exists(), reason="shared COCO captions absent")
def test_real_coco_captions_through_prepare_vocab_references(tmp_path: Path) -> None:
    """Real Karpathy val/test captions, as a Karpathy file with raw sentences only (no tokens)."""
    from caprl.data import karpathy, vocab as V

    images = []
    for split, name in (("restval", "karpathy_val5k_captions.json"), ("test", "karpathy_test5k_captions.json")):
        coco = json.loads((SHARED_COCO / name).read_text())
        by_image: dict[int, list[str]] = {}
        for ann in coco["annotations"]:
            by_image.setdefault(ann["image_id"], []).append(ann["caption"])
        for im in coco["images"]:
            images.append({"filepath": "val2014", "filename": im["file_name"], "imgid": len(images),
                           "cocoid": im["id"], "split": split,
                           "sentences": [{"raw": r} for r in by_image[im["id"]]]})
    ann = karpathy.prepare_annotations({"dataset": "coco", "images": images}, "coco")
    assert ann["stats"]["split_images"] == {"train": 5000, "val": 0, "test": 5000}
    assert ann["stats"]["restval_as_train"] == 5000
    tokens = {t for im in ann["images"] for c in im["captions"] for t in c}
    assert all(t == t.lower() and not any(ch in t for ch in ".,!?'\"") for t in tokens)

    vocab = V.build_vocab(ann, min_count=5, max_length=16)
    assert 1500 < len(vocab) < 5000
    arrays = V.encode_labels(ann, vocab)
    assert arrays["label_length"].max() == 16 and arrays["label_length"].min() >= 1
    unk_rate = (arrays["labels"] == vocab.unk_id).sum() / arrays["label_length"].sum()
    assert 0.001 < unk_rate < 0.05

    refs = build_references(ann, "test")
    official = json.loads((SHARED_COCO / "karpathy_test5k_captions.json").read_text())
    assert sorted(im["id"] for im in refs["images"]) == sorted(im["id"] for im in official["images"])
    ours = sorted((a["image_id"], a["caption"]) for a in refs["annotations"])
    theirs = sorted((a["image_id"], a["caption"]) for a in official["annotations"] if karpathy.tokenize(a["caption"]))
    assert ours == theirs
