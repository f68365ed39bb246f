"""Flickr30k through the real CLI: Karpathy's ``dataset_flickr30k.json`` (no ``filepath``, no
``cocoid``, one image folder) -> ``caprl prepare`` -> ``caprl vocab`` with the dataset's own
``datasets.flickr30k.vocab`` (paper 004: words seen more than 5 times, i.e. min_count 6)."""

from __future__ import annotations

import collections
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import pytest
import yaml
from PIL import Image

from caprl import params as params_mod
from caprl.errors import CaprlError

REPO = Path(__file__).resolve().parents[1]

# imgid -> split: the real file mixes the splits in imgid order; 12 train, 3 val, 3 test
VAL_IDS, TEST_IDS = {4, 10, 16}, {5, 11, 17}
N_IMAGES = 18
SENTENCES = [
    "Two young guys with shaggy hair look at their hands.",
    "A man in a blue shirt is standing on a ladder.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl is climbing into a wooden playhouse.",
    "Someone in a red coat walks down the street.",
]
# train caption numbers (train image position * 5 + sentence) that get an extra word:
DOG = {0, 7, 13, 22, 38, 51}       # 'dog' 6 times in train: in the vocabulary with min_count 6 or 5
GUITAR = {3, 9, 27, 44, 58}        # 'guitar' 5 times in train: out with min_count 6, in with 5
LONG_TAIL = " on a sunny afternoon in the middle of a very busy city"  # caption 1: 23 tokens


def split_of(imgid: int) -> str:
    return "val" if imgid in VAL_IDS else "test" if imgid in TEST_IDS else "train"


def karpathy_tokens(raw: str) -> list[str]:
    """Karpathy's tokens of the (apostrophe-free) sentences here: lower-case, no punctuation."""
    return [w.strip(".,").lower() for w in raw.split()]


def flickr30k_json(media: Path) -> dict[str, Any]:
    """A small ``dataset_flickr30k.json`` in Karpathy's exact format, its JPEGs written to ``media``."""
    media.mkdir(parents=True, exist_ok=True)
    images, n_train = [], 0
    for imgid in range(N_IMAGES):
        split = split_of(imgid)
        filename = f"{1000092795 + 7919 * imgid}.jpg"
        Image.new("RGB", (8, 6), (20 * (imgid % 12), 90, 200)).save(media / filename, quality=90)
        sentences = []
        for k, base in enumerate(SENTENCES):
            raw = base.rstrip(".")
            if split == "train":
                c = 5 * n_train + k
                raw += " beside a dog" * (c in DOG) + " holding a guitar" * (c in GUITAR) + LONG_TAIL * (c == 1)
            elif (imgid, k) == (4, 0):
                raw += " holding a guitar"  # val words do not count
            raw += "."
            sentences.append({"tokens": karpathy_tokens(raw), "raw": raw, "imgid": imgid, "sentid": 5 * imgid + k})
        n_train += split == "train"
        images.append({"sentids": [s["sentid"] for s in sentences], "imgid": imgid, "sentences": sentences,
                       "split": split, "filename": filename})
    return {"images": images, "dataset": "flickr30k"}


def caprl(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)  # CAPRL_PARAMS_SCHEMA: the repository schema (set by conftest)
    return subprocess.run([sys.executable, "-m", "caprl", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def write_params(tmp_path: Path, raw: Path, media: Path, vocab: dict[str, int] | None, name: str) -> Path:
    """The repository's params.yaml, ``datasets.flickr30k`` pointed at ``raw``/``media`` and its
    ``vocab`` set to ``vocab`` (None: removed, so the top-level ``vocab:`` applies)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    entry = params["datasets"]["flickr30k"]
    entry.update(raw=str(raw), media_root=str(media))
    entry.pop("vocab", None)
    if vocab is not None:
        entry["vocab"] = vocab
    path = tmp_path / name
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The generated file, prepared once by ``caprl prepare --dataset flickr30k``."""
    tmp = tmp_path_factory.mktemp("flickr30k")
    raw, media = tmp / "raw" / "dataset_flickr30k.json", tmp / "raw" / "flickr30k-images"
    data = flickr30k_json(media)
    raw.write_text(json.dumps(data))
    params = write_params(tmp, raw, media, {"min_count": 6}, "params.yaml")
    out = tmp / "data" / "annotations.json"
    result = caprl("prepare", "--params", params, "--dataset", "flickr30k", "--out", out, cwd=tmp)
    assert result.returncode == 0, result.stderr
    return {"tmp": tmp, "raw": raw, "media": media, "data": data, "out": out,
            "annotations": json.loads(out.read_text())}


def test_generated_file_is_karpathys_flickr30k_format(prepared: dict[str, Any]) -> None:
    data = prepared["data"]
    assert set(data) == {"images", "dataset"} and data["dataset"] == "flickr30k"
    for image in data["images"]:
        assert set(image) == {"sentids", "imgid", "sentences", "split", "filename"}  # no filepath, no cocoid
        assert len(image["sentences"]) == 5
        assert all(set(s) == {"tokens", "raw", "imgid", "sentid"} for s in image["sentences"])
    assert collections.Counter(im["split"] for im in data["images"]) == {"train": 12, "val": 3, "test": 3}
    assert sorted(p.name for p in prepared["media"].iterdir()) == sorted(im["filename"] for im in data["images"])


def test_prepare_ids_splits_captions_and_one_media_folder(prepared: dict[str, Any]) -> None:
    ann, data = prepared["annotations"], prepared["data"]
    assert ann["dataset"] == "flickr30k"
    assert [im["id"] for im in ann["images"]] == list(range(N_IMAGES))  # imgid, sorted
    for im, src in zip(ann["images"], data["images"]):
        assert im["split"] == split_of(src["imgid"])
        assert im["file"] == src["filename"]  # no folder part: media_root/filename
        assert (prepared["media"] / im["file"]).is_file()
        assert im["raw"] == [s["raw"] for s in src["sentences"]]
        assert im["captions"] == [s["tokens"] for s in src["sentences"]]
    assert ann["images"][0]["captions"][0] == ["two", "young", "guys", "with", "shaggy", "hair", "look", "at",
                                               "their", "hands", "beside", "a", "dog"]
    stats = ann["stats"]
    assert stats["split_images"] == {"train": 12, "val": 3, "test": 3}
    assert stats["images"] == N_IMAGES and stats["captions"] == 5 * N_IMAGES
    assert stats["restval_as_train"] == stats["empty_captions_dropped"] == 0


def test_vocab_min_count_6_is_more_than_5_times(prepared: dict[str, Any]) -> None:
    """datasets.flickr30k.vocab.min_count 6 (params.yaml) keeps words seen > 5 times; without
    the override the top-level min_count 5 keeps those seen 5 times too."""
    repo_params = params_mod.load(REPO / "params.yaml")
    assert repo_params["datasets"]["flickr30k"]["vocab"] == {"min_count": 6}
    assert params_mod.dataset_vocab(repo_params, "flickr30k") == {"min_count": 6, "max_length": 16}
    assert params_mod.dataset_vocab(repo_params, "coco") == repo_params["vocab"] == {"min_count": 5, "max_length": 16}

    tmp, ann = prepared["tmp"], prepared["annotations"]
    counts = collections.Counter(t for im in ann["images"] if im["split"] == "train" for c in im["captions"] for t in c)
    assert counts["guitar"] == 5 and counts["dog"] == 6
    words = {}
    for min_count, vocab in [(6, {"min_count": 6}), (5, None)]:
        params = write_params(tmp, prepared["raw"], prepared["media"], vocab, f"params{min_count}.yaml")
        out_vocab, out_labels = tmp / f"vocab{min_count}.json", tmp / f"labels{min_count}.h5"
        result = caprl("vocab", "--params", params, "--annotations", prepared["out"], "--out-vocab", out_vocab,
                       "--out-labels", out_labels, cwd=tmp)
        assert result.returncode == 0, result.stderr
        saved = json.loads(out_vocab.read_text())
        assert (saved["min_count"], saved["max_length"]) == (min_count, 16)  # max_length: the top-level one
        words[min_count] = set(saved["idx_to_word"][1:-1])
        assert words[min_count] == {w for w, c in counts.items() if c >= min_count}
        with h5py.File(out_labels, "r") as f:
            assert f["labels"].shape == (5 * N_IMAGES, 16) and int(f["label_length"][()].max()) == 16  # clipped
    assert "dog" in words[6] and "guitar" not in words[6]
    assert words[5] - words[6] == {w for w, c in counts.items() if c == 5} and "guitar" in words[5]


def test_params_schema_checks_the_dataset_vocab(tmp_path: Path) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"]["flickr30k"]["vocab"] = {"max_length": 20}
    assert params_mod.dataset_vocab(params, "flickr30k") == {"min_count": 5, "max_length": 20}
    bad = copy.deepcopy(params)
    bad["datasets"]["flickr30k"]["vocab"] = {"min_cnt": 6}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    with pytest.raises(CaprlError, match=r"datasets\.flickr30k\.vocab\.min_cnt"):
        params_mod.load(tmp_path / "bad.yaml")
    with pytest.raises(CaprlError, match=r"datasets\.imagenet: no such dataset"):
        params_mod.dataset_vocab(params, "imagenet")


def test_image_without_filename_names_file_and_index(prepared: dict[str, Any], tmp_path: Path) -> None:
    data = copy.deepcopy(prepared["data"])
    del data["images"][7]["filename"]
    raw = tmp_path / "dataset_flickr30k.json"
    raw.write_text(json.dumps(data))
    params = write_params(tmp_path, raw, prepared["media"], {"min_count": 6}, "params.yaml")
    out = tmp_path / "annotations.json"
    result = caprl("prepare", "--params", params, "--dataset", "flickr30k", "--out", out, cwd=tmp_path)
    assert result.returncode == 2
    assert f"{raw}: images[7] has no key 'filename'" in result.stderr
    assert not out.exists()
