"""The synthetic sets' backbone (a tiny CNN pre-trained on single shapes) and temporal segments of video features."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch

from caprl.data.synthetic import generate
from caprl.errors import CaprlError
from caprl.features import tinycnn
from caprl.features.backbones import BACKBONES, build_backbone
from caprl.features.video import pool_frames, video_attrs
from numerics import mean_atol

SETTINGS = {"backbone": "tinycnn", "tinycnn": {"weights": "builtin", "grid": 3}}


def scenes(n: int, seed: int = 3) -> list:
    return list(generate({"n_train": n, "n_val": 0, "n_test": 0, "image_size": 64, "max_objects": 3}, seed, "t"))


def test_shipped_weights_are_what_pretrain_tinycnn_makes_by_default():
    """The shipped file records the settings of `caprl pretrain-tinycnn` with no flags, and its
    held-out accuracies (single shapes, no dataset image) are high: features that name shapes."""
    _, record = tinycnn.load()
    config = tinycnn.PretrainConfig()
    assert record["config"] == {**asdict(config), "channels": list(config.channels)}
    assert min(record["held_out_accuracy"].values()) > 0.95


def test_pretraining_runs_and_loads_back(tmp_path):
    config = tinycnn.PretrainConfig(images=64, steps=3, batch_size=8, held_out=16)
    net, report = tinycnn.pretrain(config)
    assert set(report) == {"shape", "colour", "size"} and (net.scale > 0).all()
    tinycnn.save(tmp_path / "w.pt", net, config, report)
    loaded, record = tinycnn.load(tmp_path / "w.pt")
    x = torch.rand(2, 3, 64, 64)
    assert torch.equal(loaded.feature_map(x), net.feature_map(x))
    assert record["held_out_accuracy"] == report and not any(p.requires_grad for p in loaded.parameters())


def test_missing_or_foreign_weights_are_clear_errors(tmp_path):
    with pytest.raises(CaprlError, match="pretrain-tinycnn"):
        tinycnn.load(tmp_path / "none.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(CaprlError, match="not a tiny CNN weights file"):
        tinycnn.load(tmp_path / "other.pt")


def test_pooled_is_the_layout_and_regions_are_its_cells():
    assert "tinycnn" in BACKBONES
    backbone = build_backbone(SETTINGS)
    images = [s.image for s in scenes(4)]
    pooled, regions = backbone(torch.stack([backbone.preprocess(im) for im in images]))
    c = backbone.channels
    assert (backbone.grid, backbone.n_regions, backbone.dim) == (3, 9, 9 * c)
    assert pooled.shape == (4, 9 * c) and regions.shape == (4, 9, 9 * c)
    assert torch.allclose(regions.sum(dim=1), pooled)  # pooled = the sum of the regions
    for r in range(9):  # region r holds cell r's block only
        block = regions[:, r].view(4, 9, c)
        assert torch.equal(block[:, r], pooled.view(4, 9, c)[:, r])
        assert not block[:, [k for k in range(9) if k != r]].any()


def test_a_cell_says_what_stands_there():
    """The features of a cell follow its object: a scene and the same scene with the object moved
    to another cell differ in both cells' blocks and not elsewhere (up to the receptive field)."""
    from caprl.data.grammar import SceneObject
    from caprl.data.synthetic import Scene, render

    backbone = build_backbone(SETTINGS)

    def feats(col: int, row: int) -> torch.Tensor:
        obj = SceneObject("triangle", "red", "small", col, row)
        centre = ((0.2, 0.5, 0.8)[col], (0.2, 0.5, 0.8)[row])
        image = render(Scene((obj,), (centre,), (0.11,), ((220, 40, 40),), (96, 96, 96)), 64)
        return backbone(backbone.preprocess(image)[None])[0].view(9, -1)

    left, right = feats(0, 0), feats(2, 2)
    change = (left - right).abs().sum(dim=1)
    assert change[0] > 5 * change[4] and change[8] > 5 * change[4]


@pytest.mark.numerics
def test_video_segments_keep_the_order_of_events():
    backbone = build_backbone(SETTINGS)
    frames = 8
    images = [s.image for s in scenes(frames)]
    batch = torch.stack([backbone.preprocess(im) for im in images])
    reverse = batch.flip(0)
    one, regions_one = pool_frames(backbone, batch, frames, segments=1)
    per_frame = backbone(batch)[0]
    tol = mean_atol(frames, float(per_frame.abs().max()))  # the same means in other orders (tests/numerics.py)
    assert torch.allclose(one[0], per_frame.mean(0), rtol=0, atol=tol)  # S = 1: the mean over frames, as before
    assert torch.equal(regions_one[0], per_frame)
    assert torch.allclose(pool_frames(backbone, reverse, frames, 1)[0], one, rtol=0, atol=tol)  # order lost
    two, regions = pool_frames(backbone, batch, frames, segments=2)
    d = backbone.dim
    assert two.shape == (1, 2 * d) and regions.shape == (1, frames, 2 * d)
    assert torch.allclose(two[0, :d], per_frame[:4].mean(0), rtol=0, atol=tol)
    assert torch.allclose(two[0, d:], per_frame[4:].mean(0), rtol=0, atol=tol)
    assert not torch.allclose(pool_frames(backbone, reverse, frames, 2)[0], two)  # order kept
    assert not regions[0, :4, d:].any() and not regions[0, 4:, :d].any()
    assert video_attrs(backbone, frames, 2)["dim"] == 2 * d
    with pytest.raises(CaprlError, match="segments"):
        pool_frames(backbone, batch, frames, segments=9)


def test_a_dataset_overrides_video_settings(tmp_path):
    from caprl import params as params_mod

    params = params_mod.load("params.yaml")
    assert params_mod.dataset_features(params, "synthetic_video")["video"]["segments"] == 2
    assert params_mod.dataset_features(params, "tgif")["video"]["segments"] == 1  # paper 002: the mean
    assert params_mod.dataset_features(params, "synthetic")["backbone"] == "tinycnn"
    np.testing.assert_equal(params_mod.dataset_features(params, "tgif")["video"]["frames"],
                            params["features"]["video"]["frames"])
