"""Features: the patches backbone, sharded extraction, merging, the reader and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from caprl.errors import CaprlError
from caprl.features import Features
from caprl.features.backbones import BACKBONES, PatchesBackbone, build_backbone
from caprl.data.annotations import load_annotations
from caprl.features.extract import extract_features, shard_count, shard_images
from caprl.features.merge import merge_shards, shards_in
from caprl.data.feature_store import write_features

REPO = Path(__file__).resolve().parents[1]


def make_dataset(root: Path, n: int = 11, size: int = 64) -> Path:
    """n PNG images of one coloured square each, and a normalised annotations file (ids not in file order)."""
    rng = np.random.default_rng(7)
    (root / "images" / "sub").mkdir(parents=True)
    images = []
    for k in range(n):
        array = np.full((size, size, 3), 235, np.uint8)
        x, y = rng.integers(0, size // 2, 2)
        array[y:y + size // 3, x:x + size // 3] = rng.integers(0, 256, 3)
        Image.fromarray(array).save(root / "images" / "sub" / f"im{k}.png")
        images.append({"id": 1000 - 7 * k, "file": f"sub/im{k}.png", "split": "train",
                       "captions": [["a", "square"]], "raw": ["A square."]})
    ann = root / "annotations.json"
    ann.write_text(json.dumps({"dataset": "toy", "images": images}), encoding="utf-8")
    return ann


def patches() -> PatchesBackbone:
    return PatchesBackbone(grid=4, cell_size=4)


def read(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as h5:
        return {k: h5[k][:] for k in ("image_ids", "pooled", "regions")} | {"attrs": dict(h5.attrs)}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ----------------------------------------------------------------------------- patches backbone


def test_patches_red_left_half_shows_in_left_regions() -> None:
    array = np.full((64, 64, 3), 255, np.uint8)
    array[:, :32] = (255, 0, 0)
    bb = patches()
    pooled, regions = bb(bb.preprocess(Image.fromarray(array)).unsqueeze(0))
    assert (bb.dim, bb.n_regions) == (48, 16)
    assert pooled.shape == (1, 48) and regions.shape == (1, 16, 48)
    cells = regions[0].view(4, 4, 3, 16)  # grid row, grid col, channel, pixel of the cell
    red = torch.tensor([1.0, -1.0, -1.0]).view(3, 1)
    assert torch.allclose(cells[:, :2], red.expand(3, 16).expand(4, 2, 3, 16), atol=1e-6)  # left columns red
    assert torch.allclose(cells[:, 2:], torch.ones(4, 2, 3, 16), atol=1e-6)  # right columns white
    # pooled: a 4x4 thumbnail of the whole image, each pixel the mean of one cell (layout kept)
    thumb = pooled[0].view(3, 4, 4)
    assert torch.allclose(thumb[:, :, :2], red.view(3, 1, 1).expand(3, 4, 2), atol=1e-6)
    assert torch.allclose(thumb[:, :, 2:], torch.ones(3, 4, 2), atol=1e-6)
    assert torch.allclose(thumb.mean(dim=(1, 2)), regions[0].view(16, 3, 16).mean(dim=(0, 2)), atol=1e-6)


def test_patches_regions_are_row_major_and_resize_any_image() -> None:
    array = np.zeros((100, 100), np.uint8)  # greyscale, not the working size
    array[:25, 75:] = 255  # top-right cell only
    bb = patches()
    _, regions = bb(bb.preprocess(Image.fromarray(array, mode="L")).unsqueeze(0))
    bright = (regions[0].mean(dim=1) > 0).nonzero().flatten().tolist()
    assert bright == [3]


def test_patches_extras_add_channels() -> None:
    array = np.full((64, 64, 3), 128, np.uint8)
    array[16:32, 16:32] = (0, 0, 255)
    bb = PatchesBackbone(grid=4, cell_size=4, extras=("saturation", "edges"))
    assert bb.dim == 5 * 16
    _, regions = bb(bb.preprocess(Image.fromarray(array)).unsqueeze(0))
    saturation, edges = regions[0, :, 48:64].mean(1), regions[0, :, 64:].mean(1)
    assert saturation.argmax().item() == 5 and edges[5] > edges[0]
    with pytest.raises(CaprlError, match="extras"):
        PatchesBackbone(extras=("texture",))


def test_registry_builds_from_params() -> None:
    assert {"patches", "resnet101", "resnet152"} <= set(BACKBONES)
    bb = build_backbone({"backbone": "patches", "patches": {"grid": 2, "cell_size": 3}})
    assert isinstance(bb, PatchesBackbone) and (bb.n_regions, bb.dim) == (4, 27)
    with pytest.raises(CaprlError, match="unknown backbone"):
        build_backbone({"backbone": "vgg"})


# ----------------------------------------------------------------------------- sharding and merging


def test_shards_cover_every_image_once_and_merge_equals_unsharded(tmp_path: Path) -> None:
    ann = make_dataset(tmp_path)
    images = load_annotations(ann)["images"]
    root = tmp_path / "images"
    shards = [shard_images(images, i, 3) for i in range(3)]
    ids = sorted(int(im["id"]) for shard in shards for im in shard)
    assert ids == sorted(int(im["id"]) for im in images)  # every image exactly once
    assert [len(s) for s in shards] == [4, 4, 3]

    paths = []
    for i, shard in enumerate(shards):
        paths.append(tmp_path / f"shard{i}.h5")
        extract_features(shard, root, patches(), paths[-1], batch_size=2, attrs={"shard": i, "n_shards": 3})
    whole = tmp_path / "whole.h5"
    extract_features(shard_images(images, 0, 1), root, patches(), whole, batch_size=5)
    merged = tmp_path / "merged.h5"
    assert merge_shards(paths[::-1], merged, annotation_ids=[int(im["id"]) for im in images]) == len(images)

    got, want = read(merged), read(whole)
    assert list(got["image_ids"]) == sorted(got["image_ids"]) == ids
    for key in ("image_ids", "pooled", "regions"):
        assert np.array_equal(got[key], want[key])
    assert got["attrs"]["backbone"] == "patches" and got["attrs"]["n_regions"] == 16
    assert "shard" not in got["attrs"]
    assert leftovers(tmp_path) == []


def test_extraction_is_deterministic(tmp_path: Path) -> None:
    ann = make_dataset(tmp_path)
    images = load_annotations(ann)["images"]
    for name in ("a.h5", "b.h5"):
        extract_features(images, tmp_path / "images", patches(), tmp_path / name, batch_size=3)
    a, b = read(tmp_path / "a.h5"), read(tmp_path / "b.h5")
    for key in ("image_ids", "pooled", "regions"):
        assert np.array_equal(a[key], b[key])
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()  # no timestamps: DVC-friendly


def test_shard_ids_must_match_params() -> None:
    assert shard_count(1, [0, 1]) == 2
    with pytest.raises(CaprlError, match="--shard 2"):
        shard_count(2, [0, 1])
    with pytest.raises(CaprlError, match="features.shards"):
        shard_count(0, [0, 2])


def test_merge_rejects_duplicates_missing_and_mixed_shards(tmp_path: Path) -> None:
    attrs = {"backbone": "patches", "grid": 1, "dim": 2, "n_regions": 1}
    z = np.zeros((2, 2), np.float32)
    write_features(tmp_path / "a.h5", [1, 2], z, z[:, None], attrs)
    write_features(tmp_path / "b.h5", [2, 3], z, z[:, None], attrs)
    write_features(tmp_path / "c.h5", [3, 4], z, z[:, None], attrs | {"backbone": "other"})
    out = tmp_path / "out.h5"
    with pytest.raises(CaprlError, match=r"image id 2 is in .*a\.h5 and in .*b\.h5"):
        merge_shards([tmp_path / "a.h5", tmp_path / "b.h5"], out)
    with pytest.raises(CaprlError, match=r"c\.h5 differs .* in backbone"):
        merge_shards([tmp_path / "a.h5", tmp_path / "c.h5"], out)
    with pytest.raises(CaprlError, match="lack features for image id.*5"):
        merge_shards([tmp_path / "a.h5"], out, annotation_ids=[1, 2, 5])
    with pytest.raises(CaprlError, match="not in"):
        merge_shards([tmp_path / "a.h5"], out, annotation_ids=[1])
    with pytest.raises(CaprlError, match="not found"):
        merge_shards([tmp_path / "nope.h5"], out)
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    with pytest.raises(CaprlError, match=r"bad\.h5: not a readable HDF5"):
        merge_shards([tmp_path / "bad.h5"], out)
    write_features(tmp_path / "s0.h5", [1], z[:1], z[:1, None], attrs | {"shard": 0, "n_shards": 2})
    with pytest.raises(CaprlError, match=r"shard\(s\) \[1\] of 2 missing"):
        merge_shards([tmp_path / "s0.h5"], out)
    write_features(tmp_path / "old.h5", [2], z[:1], z[:1, None], attrs | {"shard": 2, "n_shards": 3})
    with pytest.raises(CaprlError, match=r"cut \[2, 3\] ways.*delete stale"):
        merge_shards([tmp_path / "s0.h5", tmp_path / "old.h5"], out)
    assert not out.exists() and leftovers(tmp_path) == []


def test_shard_dir_lists_h5_files_only(tmp_path: Path) -> None:
    for name in ("shard1.h5", "shard0.h5", ".shard2.h5.x.tmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in shards_in(tmp_path)] == ["shard0.h5", "shard1.h5"]
    with pytest.raises(CaprlError, match="no such folder"):
        shards_in(tmp_path / "nope")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing"])
def test_bad_image_names_file_and_leaves_no_output(tmp_path: Path, damage: str) -> None:
    ann = make_dataset(tmp_path, n=6)
    images = load_annotations(ann)["images"]
    bad = tmp_path / "images" / "sub" / "im4.png"
    if damage == "corrupt":
        bad.write_bytes(b"\x00garbage, not a png" * 10)
    elif damage == "truncated":
        bad.write_bytes(bad.read_bytes()[:60])
    else:
        bad.unlink()
    out = tmp_path / "out" / "f.h5"
    with pytest.raises(CaprlError) as info:
        extract_features(images, tmp_path / "images", patches(), out, batch_size=2)
    message = str(info.value)
    assert str(bad) in message and "image id 972" in message
    assert ("not found" if damage == "missing" else "cannot decode") in message
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])


def test_malformed_annotations_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "ann.json"
    entry = {"split": "train", "captions": [["a"]], "raw": ["A."]}
    doc = {"dataset": "toy", "images": [{"id": 1, "file": "a.png", **entry}, {"id": 2, **entry}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(CaprlError, match=r"ann\.json: images\[1\] has no key 'file'"):
        load_annotations(path)
    doc["images"][1] = {"id": 1, "file": "b.png", **entry}
    path.write_text(json.dumps(doc))
    with pytest.raises(CaprlError, match="repeats id 1"):
        load_annotations(path)


# ----------------------------------------------------------------------------- reader


@pytest.mark.parametrize("in_memory", [True, False])
def test_reader_returns_rows_in_the_order_asked(tmp_path: Path, in_memory: bool) -> None:
    ids = np.array([3, 8, 20, 41])
    pooled = np.arange(8, dtype=np.float32).reshape(4, 2)
    regions = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    write_features(tmp_path / "f.h5", ids, pooled, regions, {"backbone": "patches", "grid": 1, "dim": 2, "n_regions": 3})
    with Features(tmp_path / "f.h5", in_memory=in_memory) as feats:
        assert (len(feats), feats.dim, feats.n_regions, feats.backbone) == (4, 2, 3, "patches")
        assert 8 in feats and 9 not in feats
        p, r = feats.get([41, 3, 41])
        assert p.dtype == torch.float32 and r.shape == (3, 3, 2)
        assert torch.equal(p, torch.from_numpy(pooled[[3, 0, 3]]))
        assert torch.equal(r, torch.from_numpy(regions[[3, 0, 3]]))
        with pytest.raises(CaprlError, match="no features for image id 9"):
            feats.get([3, 9])


# ----------------------------------------------------------------------------- CLI (real subprocesses)


def run_caprl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CAPRL_PARAMS_SCHEMA=str(REPO / "workflow" / "schemas" / "params.schema.yaml"))
    return subprocess.run([sys.executable, "-m", "caprl", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_features_and_merge(tmp_path: Path) -> None:
    ann = make_dataset(tmp_path, n=9)
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["features"].update(shards=[0, 1], batch_size=4, num_threads=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    common = ["--params", "params.yaml", "--dataset", "synthetic", "--annotations", str(ann), "--image-root", "images"]
    for shard in (0, 1):
        done = run_caprl(tmp_path, "features", *common, "--shard", str(shard), "--out", f"feats/shard{shard}.h5")
        assert done.returncode == 0, done.stderr
    done = run_caprl(tmp_path, "merge-features", "--params", "params.yaml", "--annotations", str(ann),
                     "--shard-dir", "feats", "--out", "all.h5")
    assert done.returncode == 0, done.stderr
    with Features(tmp_path / "all.h5") as feats:
        ids = [int(im["id"]) for im in load_annotations(ann)["images"]]
        assert list(feats.image_ids) == sorted(ids)
        assert read(tmp_path / "feats" / "shard0.h5")["attrs"]["n_shards"] == 2
        pooled, regions = feats.get(ids)
        assert pooled.shape == (9, 576) and regions.shape == (9, 9, 576)  # tinycnn, grid 3

    (tmp_path / "images" / "sub" / "im2.png").write_bytes(b"garbage")
    done = run_caprl(tmp_path, "features", *common, "--shard", "0", "--out", "feats/again.h5")
    assert done.returncode == 2
    assert "im2.png" in done.stderr and "image id 986" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "feats" / "again.h5").exists() and leftovers(tmp_path / "feats") == []
