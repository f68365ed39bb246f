"""The ``clip`` backbone, on CPU with random weights and tiny configs (no download), and through ``caprl features``."""

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
from transformers import CLIPVisionConfig, CLIPVisionModel

from caprl.errors import CaprlError
from caprl.features import Features
from caprl.features.backbones import BACKBONES, build_backbone
from caprl.features.clip_grid import CLIP_MEAN, CLIP_STD, CLIPBackbone, clip_config, clip_grid, clip_preprocess
from caprl.features.extract import extract_features

REPO = Path(__file__).resolve().parents[1]


def tiny_model(seed: int = 0, layers: int = 1) -> CLIPVisionModel:
    """32-pixel images, 8-pixel patches (a 4 x 4 grid), width 16."""
    torch.manual_seed(seed)
    config = CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=layers, num_attention_heads=2)
    return CLIPVisionModel(config)


def tiny(seed: int = 0, layers: int = 1, image_size: int = 32) -> CLIPBackbone:
    return CLIPBackbone(tiny_model(seed, layers), image_size=image_size, model_name="tiny", device="cpu")


def images(sizes: tuple[tuple[int, int], ...] = ((50, 70), (64, 40), (32, 32))) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def test_registered_as_clip() -> None:
    assert BACKBONES.get("clip") is CLIPBackbone and CLIPBackbone.name == "clip"


@pytest.mark.numerics
def test_shapes_are_the_patch_grid_and_the_cls_token() -> None:
    bb = tiny()
    batch = torch.stack([bb.preprocess(im) for im in images()])  # three sizes, one batch
    assert batch.shape == (3, 3, 32, 32) and batch.dtype == torch.float32
    pooled, regions = bb(batch)
    assert (bb.grid, bb.n_regions, bb.dim) == (4, 16, 16)
    assert pooled.shape == (3, 16) and regions.shape == (3, 16, 16)
    assert pooled.dtype == regions.dtype == torch.float32 and pooled.device.type == "cpu"

    out = bb.model(pixel_values=batch)
    assert torch.equal(pooled, out.last_hidden_state[:, 0])  # CLS, before post_layernorm
    assert torch.equal(regions, out.last_hidden_state[:, 1:])
    # bit-identical: HF's pooler_output is this post_layernorm of this CLS row (same kernel, same shape)
    assert torch.equal(bb.model.post_layernorm(pooled), out.pooler_output)  # what HF calls pooled


def test_regions_are_row_major_patches() -> None:
    """Without transformer blocks a token sees only its own patch: a change in the top-right patch
    (row 0, column 3) shows in region 3 only."""
    bb = tiny(layers=0)
    x = torch.zeros(1, 3, 32, 32)
    y = x.clone()
    y[:, :, 0:8, 24:32] = 1.0
    (p0, r0), (p1, r1) = bb(x), bb(y)
    changed = (r0 - r1).abs().sum(-1)[0] > 1e-6
    assert changed.nonzero().flatten().tolist() == [3]
    assert torch.equal(p0, p1)  # the CLS token does not see the image without attention


def test_preprocessing_is_clips_by_hand() -> None:
    rng = np.random.default_rng(1)
    # short side already 32: no resize; 48 tall -> crop rows 8..40 (round(16 / 2)), all 32 columns
    array = rng.integers(0, 256, (48, 32, 3), dtype=np.uint8)
    mean, std = np.array(CLIP_MEAN, np.float32), np.array(CLIP_STD, np.float32)
    expected = ((array[8:40].astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)
    got = clip_preprocess(Image.fromarray(array), 32)
    assert got.shape == (3, 32, 32)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-6)

    # 40 x 75 (h x w): bicubic to 32 x int(32 * 75 / 40) = 32 x 60, then columns round(28 / 2) = 14..46
    array = rng.integers(0, 256, (40, 75, 3), dtype=np.uint8)
    resized = np.asarray(Image.fromarray(array).resize((60, 32), Image.Resampling.BICUBIC), np.float32)
    expected = ((resized[:, 14:46] / 255.0 - mean) / std).transpose(2, 0, 1)
    np.testing.assert_allclose(clip_preprocess(Image.fromarray(array), 32).numpy(), expected, rtol=0, atol=1e-6)

    # greyscale and RGBA inputs become RGB
    assert clip_preprocess(Image.fromarray(array[..., 0]), 32).shape == (3, 32, 32)
    assert clip_preprocess(Image.fromarray(array).convert("RGBA"), 32).shape == (3, 32, 32)


def test_preprocessing_matches_transformers_clip_processor() -> None:
    """An independent implementation: transformers' CLIP image processor (PIL backend), at sizes
    where its floor-halved crop offset equals torchvision's rounded one."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    proc = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    for im in images(((64, 100), (100, 64), (50, 71), (32, 32), (31, 90))):
        theirs = proc(images=im, return_tensors="pt")["pixel_values"][0]
        assert torch.allclose(clip_preprocess(im, 32), theirs, atol=1e-6)


def test_deterministic_and_written_to_hdf5(tmp_path: Path) -> None:
    root = tmp_path / "images"
    root.mkdir()
    records = []
    for k, im in enumerate(images(((50, 70), (64, 40), (32, 32), (90, 33), (40, 40)))):
        im.save(root / f"{k}.png")
        records.append({"id": 10 + k, "file": f"{k}.png"})
    for name in ("a.h5", "b.h5"):
        extract_features(records, root, tiny(seed=3), tmp_path / name, batch_size=2)
    with Features(tmp_path / "a.h5") as a, Features(tmp_path / "b.h5", in_memory=False) as b:
        assert a.backbone == "clip" and (a.grid, a.n_regions, a.dim) == (4, 16, 16)
        pa, ra = a.get(list(range(10, 15)))
        pb, rb = b.get(list(range(10, 15)))
        assert torch.equal(pa, pb) and torch.equal(ra, rb)
        assert torch.isfinite(ra).all()
    bb = tiny(seed=3)
    batch = torch.stack([bb.preprocess(im) for im in images()])
    assert all(torch.equal(u, v) for u, v in zip(bb(batch), bb(batch)))
    assert not torch.equal(bb(batch)[1], tiny(seed=4)(batch)[1])  # the weights do matter


def test_other_image_size_interpolates_the_position_embeddings() -> None:
    bb = tiny(image_size=64)
    assert (bb.grid, bb.n_regions, bb.interpolate) == (8, 64, True)
    pooled, regions = bb(torch.stack([bb.preprocess(im) for im in images()]))
    assert pooled.shape == (3, 16) and regions.shape == (3, 64, 16)
    with pytest.raises(CaprlError, match="features.clip.image_size: 36 is not a multiple of the model's patch size 8"):
        tiny(image_size=36)


def test_known_models_build_locally_and_bad_settings_are_refused() -> None:
    for model, (grid, width, layers) in {"openai/clip-vit-base-patch32": (7, 768, 12),
                                         "openai/clip-vit-base-patch16": (14, 768, 12),
                                         "openai/clip-vit-large-patch14": (16, 1024, 24)}.items():
        config = clip_config(model)
        assert (config.hidden_size, config.num_hidden_layers, config.hidden_act) == (width, layers, "quick_gelu")
        assert clip_grid({"model": model, "image_size": 224}) == grid
    assert clip_grid({"model": "openai/clip-vit-base-patch32", "image_size": 448}) == 14  # CLIP-ViL's 14 x 14
    with pytest.raises(CaprlError, match="features.clip.model: unknown CLIP model 'openai/clip-vit-huge'; known: "):
        build_backbone({"backbone": "clip", "clip": {"model": "openai/clip-vit-huge", "pretrained": False,
                                                     "image_size": 224}})
    with pytest.raises(CaprlError, match="image_size: 230 is not a multiple of the model's patch size 32"):
        build_backbone({"backbone": "clip", "clip": {"model": "openai/clip-vit-base-patch32", "pretrained": False,
                                                     "image_size": 230}})


def test_provenance_names_the_model() -> None:
    attrs = tiny().attrs()
    config = json.loads(attrs["backbone_config"])
    assert attrs["backbone"] == "clip" and (attrs["grid"], attrs["dim"], attrs["n_regions"]) == (4, 16, 16)
    assert config["model"] == "tiny" and config["pretrained"] is False and config["image_size"] == 32
    assert "before post_layernorm" in config["read"]


def test_the_plan_costs_clip_features_and_its_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`caprl plan`: COCO with backbone clip costs its feature jobs (step_costs.yaml) and trains on 7 x 7 regions."""
    from caprl import params as params_mod
    from caprl.workflow import costs

    monkeypatch.chdir(tmp_path)  # no data/coco/annotations.json: the known Karpathy sizes
    overlay = {"datasets": {"synthetic": {"enabled": False}, "synthetic_video": {"enabled": False},
                            "coco": {"enabled": True, "backbone": "clip", "runs": ["topdown-xe"], "tables": ["main"]}},
               "tuning": {"runs": {}}}
    (tmp_path / "clip.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    params = params_mod.load([REPO / "params.yaml", tmp_path / "clip.yaml"])
    rows = {row.job: row for row in costs.estimate(params, "cpu").rows}
    assert "49 regions" in rows["train coco/topdown-xe"].basis
    shard = rows["features coco/shard0"]
    ms = costs.load_costs()["backbones"]["clip"]["ms"]
    assert shard.gpu and shard.hours == pytest.approx(shard.steps * ms / 3.6e6)


# ----------------------------------------------------------------------------- CLI (a real subprocess)


def test_cli_features_with_a_random_weight_clip(tmp_path: Path) -> None:
    """``caprl features`` on a tiny generated dataset, backbone clip (full ViT-B/32, random weights)."""
    root = tmp_path / "images"
    root.mkdir()
    recs = []
    for k, im in enumerate(images(((60, 80), (80, 60), (48, 48)))):
        im.save(root / f"im{k}.png")
        recs.append({"id": 500 - k, "file": f"im{k}.png", "split": "train", "captions": [["a", "picture"]],
                     "raw": ["A picture."]})
    ann = tmp_path / "annotations.json"
    ann.write_text(json.dumps({"dataset": "toy", "images": recs}), encoding="utf-8")
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["datasets"]["synthetic"]["backbone"] = "clip"
    params["features"].update(shards=[0], batch_size=2, num_threads=1)
    params["features"]["clip"]["pretrained"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    env = dict(os.environ, CAPRL_PARAMS_SCHEMA=str(REPO / "workflow" / "schemas" / "params.schema.yaml"),
               CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "caprl", "features", "--params", "params.yaml", "--dataset",
                           "synthetic", "--annotations", str(ann), "--image-root", "images", "--shard", "0",
                           "--out", "feats/shard0.h5"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "feats" / "shard0.h5", "r") as h5:
        assert sorted(h5) == ["image_ids", "pooled", "regions"]
        assert h5["image_ids"][:].tolist() == [498, 499, 500]
        assert h5["pooled"].shape == (3, 768) and h5["regions"].shape == (3, 49, 768)  # 7 x 7 patches of 32
        assert h5["pooled"].dtype == h5["regions"].dtype == np.float32
        assert np.isfinite(h5["regions"][:]).all()
        attrs = dict(h5.attrs)
    assert (attrs["backbone"], attrs["grid"], attrs["dim"], attrs["n_regions"]) == ("clip", 7, 768, 49)
    config = json.loads(attrs["backbone_config"])
    assert config["model"] == "openai/clip-vit-base-patch32" and config["pretrained"] is False
    assert attrs["dataset"] == "synthetic" and attrs["n_shards"] == 1
