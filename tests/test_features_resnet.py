"""The ResNet backbones' code path, on CPU with random weights and a tiny config (no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ResNetConfig, ResNetModel

from caprl.features import Features
from caprl.features.backbones import ResNet101Backbone, ResNet152Backbone, build_backbone, resnet_config
from caprl.features.extract import extract_features
from numerics import mean_atol


def tiny_model(seed: int = 0) -> ResNetModel:
    torch.manual_seed(seed)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 24], depths=[1, 1, 1, 1], layer_type="bottleneck")
    return ResNetModel(config)


def images(n: int = 3) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (50 + 10 * k, 70, 3), dtype=np.uint8)) for k in range(n)]


@pytest.mark.numerics
def test_tiny_resnet_shapes_and_pooling() -> None:
    bb = ResNet101Backbone(tiny_model(), image_size=128, grid=2, device="cpu")
    batch = torch.stack([bb.preprocess(im) for im in images()])
    assert batch.shape == (3, 3, 128, 128)
    pooled, regions = bb(batch)
    assert (bb.dim, bb.n_regions) == (24, 4)  # dim = last hidden size; grid x grid regions
    assert pooled.shape == (3, 24) and regions.shape == (3, 4, 24)
    assert pooled.dtype == regions.dtype == torch.float32

    fmap = bb.feature_map(batch)  # [3, 24, 4, 4]: stride 32
    assert fmap.shape == (3, 24, 4, 4)
    # means of the same map's cells by other kernels (or means of means): tests/numerics.py's bound
    m = float(fmap.abs().max())
    assert torch.allclose(pooled, fmap.mean(dim=(2, 3)), rtol=0, atol=mean_atol(16, m))  # pooled = mean of the map
    assert torch.allclose(pooled, bb.model(pixel_values=batch).pooler_output.flatten(1), rtol=0, atol=mean_atol(16, m))
    top_right = fmap[:, :, :2, 2:].mean(dim=(2, 3))  # region 1 = row 0, column 1
    assert torch.allclose(regions[:, 1], top_right, rtol=0, atol=mean_atol(4, m))
    assert torch.allclose(regions.mean(dim=1), pooled, rtol=0, atol=mean_atol(16, m))


def test_tiny_resnet_is_deterministic_and_writes_hdf5(tmp_path: Path) -> None:
    root = tmp_path / "images"
    root.mkdir()
    records = []
    for k, im in enumerate(images(5)):
        im.save(root / f"{k}.png")
        records.append({"id": 10 + k, "file": f"{k}.png"})
    for name in ("a.h5", "b.h5"):
        bb = ResNet152Backbone(tiny_model(seed=3), image_size=64, grid=3, device="cpu")
        extract_features(records, root, bb, tmp_path / name, batch_size=2)
    with Features(tmp_path / "a.h5") as a, Features(tmp_path / "b.h5", in_memory=False) as b:
        assert a.backbone == "resnet152" and (a.grid, a.n_regions, a.dim) == (3, 9, 24)
        pa, ra = a.get(list(range(10, 15)))
        pb, rb = b.get(list(range(10, 15)))
        assert torch.equal(pa, pb) and torch.equal(ra, rb)
        assert ra.shape == (5, 9, 24) and torch.isfinite(ra).all()


def test_full_size_configs_are_built_locally() -> None:
    for name, depths in (("resnet101", [3, 4, 23, 3]), ("resnet152", [3, 8, 36, 3])):
        config = resnet_config(name)
        assert config.depths == depths and config.hidden_sizes[-1] == 2048


@pytest.mark.parametrize("name", ["resnet101"])
def test_random_weight_resnet_from_params(name: str) -> None:
    features = {"backbone": name, "resnet": {"pretrained": False, "image_size": 64, "grid": 2}}
    bb = build_backbone(features)
    assert (bb.name, bb.dim, bb.n_regions) == (name, 2048, 4)
    pooled, regions = bb(bb.preprocess(images(1)[0]).unsqueeze(0))
    assert pooled.shape == (1, 2048) and regions.shape == (1, 4, 2048)
