"""The synthetic image dataset: determinism, Karpathy format, captions true to the images."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from caprl.data import grammar, synthesize, synthetic
from caprl.data.grammar import SceneObject
from caprl.data.karpathy import tokenize
from caprl.errors import CaprlError
from conftest import default_params

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "params.schema.yaml"
TINY = {"n_train": 12, "n_val": 3, "n_test": 3, "image_size": 64, "max_objects": 3}


def write_tiny(tmp: Path, seed: int = 7, cfg: dict | None = None) -> tuple[Path, Path]:
    cfg = cfg or TINY
    out_json, image_dir = tmp / "dataset_synthetic.json", tmp / "images"
    total = sum(cfg[f"n_{s}"] for s in ("train", "val", "test"))
    synthetic.write_dataset(synthetic.generate(cfg, seed), total, out_json, image_dir)
    return out_json, image_dir


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files_and_other_seed_differs(tmp_path: Path) -> None:
    a_json, a_dir = write_tiny(tmp_path / "a", seed=7)
    b_json, b_dir = write_tiny(tmp_path / "b", seed=7)
    c_json, c_dir = write_tiny(tmp_path / "c", seed=8)
    assert a_json.read_bytes() == b_json.read_bytes()
    assert tree_bytes(a_dir) == tree_bytes(b_dir)
    assert len(tree_bytes(a_dir)) == 18
    assert a_json.read_bytes() != c_json.read_bytes()
    differing = [k for k, v in tree_bytes(a_dir).items() if tree_bytes(c_dir)[k] != v]
    assert len(differing) >= 15


def test_two_dataset_names_give_two_datasets() -> None:
    """The dataset name is mixed into every random stream: two generated datasets differ."""
    a = list(synthetic.generate(TINY, 3, "synthetic"))
    b = list(synthetic.generate(TINY, 3, "shapes_b"))
    assert [s.entry["sentences"][0]["raw"] for s in a] != [s.entry["sentences"][0]["raw"] for s in b]
    assert sum(x.image.tobytes() != y.image.tobytes() for x, y in zip(a, b)) >= len(a) - 2
    assert [s.image.tobytes() for s in a] == [s.image.tobytes() for s in synthetic.generate(TINY, 3, "synthetic")]


def test_main_generates_the_named_dataset_with_its_overrides(tmp_path: Path, write_params) -> None:
    params = default_params()
    params["synthetic"].update(n_train=4, n_val=2, n_test=2, image_size=32)
    params["datasets"]["shapes_b"] = {**params["datasets"]["synthetic"], "raw": "data/raw/shapes_b/dataset_shapes_b.json",
                                      "media_root": "data/raw/shapes_b/images", "synthetic": {"n_train": 3}}
    args = argparse.Namespace(params=write_params(params), dataset="shapes_b", out_json=tmp_path / "b.json",
                              image_dir=tmp_path / "b")
    synthesize.main(args)
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["dataset"] == "shapes_b"
    assert [im["split"] for im in data["images"]] == ["train"] * 3 + ["val"] * 2 + ["test"] * 2


def test_val_and_test_images_do_not_depend_on_n_train() -> None:
    small = list(synthetic.generate({**TINY, "n_train": 2}, 3))
    large = list(synthetic.generate({**TINY, "n_train": 9}, 3))
    assert [s.entry["sentences"][0]["raw"] for s in small[2:]] == [s.entry["sentences"][0]["raw"] for s in large[9:]]
    assert [s.image.tobytes() for s in small[2:]] == [s.image.tobytes() for s in large[9:]]


def test_karpathy_format_and_files_resolve(tmp_path: Path) -> None:
    out_json, image_dir = write_tiny(tmp_path)
    data = json.loads(out_json.read_text())
    assert data["dataset"] == "synthetic"
    images = data["images"]
    assert [im["split"] for im in images] == ["train"] * 12 + ["val"] * 3 + ["test"] * 3
    assert [im["imgid"] for im in images] == list(range(18))
    sentids = [sid for im in images for sid in im["sentids"]]
    assert len(sentids) == len(set(sentids)) == 18 * 5
    for im in images:
        assert set(im) == {"filepath", "filename", "imgid", "split", "sentids", "cocoid", "sentences"}
        path = image_dir / im["filepath"] / im["filename"]
        with Image.open(path) as img:
            assert img.size == (64, 64) and img.mode == "RGB"
        assert [s["sentid"] for s in im["sentences"]] == im["sentids"]
        for s in im["sentences"]:
            assert s["imgid"] == im["imgid"]
            assert s["tokens"] == tokenize(s["raw"]) and s["tokens"]
            assert s["raw"][0].isupper() and s["raw"].endswith(".")
        assert len({s["raw"] for s in im["sentences"]}) == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_captions_are_true_to_the_scene() -> None:
    samples = list(synthetic.generate({**TINY, "n_train": 150}, 11))
    n_salient_only = 0
    for sample in samples:
        objects = sample.scene.objects
        salient = grammar.salience_order(objects)[0]
        scene_colours = {o.colour for o in objects}
        for sentence in sample.entry["sentences"]:
            colours = {t for t in sentence["tokens"] if t in grammar.COLOURS}
            assert salient.colour in colours, (sentence["raw"], objects)
            assert colours <= scene_colours
            n_salient_only += len(scene_colours) > 1 and len(colours) == 1
    assert n_salient_only > 50
    assert {len(s.scene.objects) for s in samples} == {1, 2, 3}


def test_vocabulary_is_modest_and_captions_short() -> None:
    samples = list(synthetic.generate({**TINY, "n_train": 400}, 5))
    captions = [s["tokens"] for sample in samples for s in sample.entry["sentences"]]
    words = {t for c in captions for t in c}
    assert 50 <= len(words) <= 80
    assert sum(len(c) > 16 for c in captions) / len(captions) < 0.01


def test_relation_and_location_phrases() -> None:
    rng = np.random.default_rng(0)
    left = SceneObject("circle", "red", "large", 0, 1)
    right = SceneObject("square", "blue", "small", 2, 1)
    top = SceneObject("cross", "green", "small", 0, 0)
    for _ in range(20):
        assert grammar.relation(left, right, rng) in {"to the left of", "left of", "next to", "beside"}
        assert grammar.relation(right, left, rng) in {"to the right of", "right of", "next to", "beside"}
        assert grammar.relation(top, left, rng) in {"above", "over"}
        assert grammar.relation(left, top, rng) in {"below", "under", "beneath"}
        assert "left" in grammar.location(left, rng)
    assert grammar.noun_phrase(SceneObject("cross", "orange", "large", 1, 1), rng, 0.0).startswith("an orange ")


def test_render_draws_each_object_in_its_colour() -> None:
    for sample in synthetic.generate({**TINY, "n_train": 30}, 2):
        pixels = np.asarray(sample.image).astype(int)
        scene = sample.scene
        for (cx, cy), rgb in zip(scene.centres, scene.rgbs):
            y, x = int(cy * 64), int(cx * 64)
            assert np.abs(pixels[y, x] - np.array(rgb)).max() <= 2
        is_background = np.abs(pixels - np.array(scene.background)).max(axis=-1) <= 2
        assert 0.3 < is_background.mean() < 0.99


def test_atomic_directory_keeps_old_output_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "images"
    with synthetic.atomic_directory(target) as tmp:
        (tmp / "a.png").write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with synthetic.atomic_directory(target) as tmp:
            (tmp / "a.png").write_bytes(b"new-partial")
            raise RuntimeError("killed mid-write")
    assert (target / "a.png").read_bytes() == b"old"
    with synthetic.atomic_directory(target) as tmp:
        (tmp / "b.png").write_bytes(b"new")
    assert [p.name for p in target.iterdir()] == ["b.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["images"]  # no temp or old dirs left


def test_failed_generation_leaves_no_output(tmp_path: Path) -> None:
    def failing():
        yield from synthetic.generate(TINY, 1)
        raise OSError("disk full")

    with pytest.raises(OSError):
        synthetic.write_dataset(failing(), 18, tmp_path / "d.json", tmp_path / "images")
    assert list(tmp_path.iterdir()) == []


def test_main_refuses_json_inside_image_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPRL_PARAMS_SCHEMA", str(SCHEMA))
    image_dir = tmp_path / "im"
    args = argparse.Namespace(params=REPO / "params.yaml", dataset="synthetic", out_json=image_dir / "d.json",
                              image_dir=image_dir)
    with pytest.raises(CaprlError, match="inside --media-dir"):
        synthesize.main(args)


def test_cli_synthesize_subprocess(tmp_path: Path) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["synthetic"].update({"n_train": 10, "n_val": 2, "n_test": 2, "image_size": 48})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(SCHEMA)}
    raw = tmp_path / "raw"
    cmd = [sys.executable, "-m", "caprl", "synthesize", "--params", str(tmp_path / "params.yaml"), "--dataset", "synthetic",
           "--out-json", str(raw / "dataset_synthetic.json"), "--image-dir", str(raw / "images")]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "raw" / "dataset_synthetic.json").read_text())
    assert len(data["images"]) == 14
    assert len(list((tmp_path / "raw" / "images").rglob("*.png"))) == 14
    with Image.open(tmp_path / "raw" / "images" / "test" / "000013.png") as img:
        assert img.size == (48, 48)
    assert "wrote 14 images" in result.stderr
