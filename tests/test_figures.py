"""The attention figure (Stack-Cap Fig. 3): maps where the weights are, one PNG per image."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from caprl.errors import CaprlError
from caprl.figures import attention as fig_mod
from caprl.models import build_model
from caprl.data.vocab import Vocab
from caprl.models import checkpoint
from pipeline_data import tiny_files

REPO = Path(__file__).resolve().parents[1]


def test_attention_map_puts_the_peak_in_the_attended_cell() -> None:
    alpha = np.zeros(16)
    alpha[4 * 1 + 2] = 1.0  # row 1, column 2 of a 4x4 grid
    heat = fig_mod.attention_map(alpha, grid=4, height=40, width=80)
    assert heat.shape == (40, 80) and heat.max() == pytest.approx(1.0)
    row, col = np.unravel_index(heat.argmax(), heat.shape)
    assert 10 <= row < 20 and 40 <= col < 60
    assert 0 < heat[20, 50] < heat[15, 50]  # smoothed, not a hard square
    flat = fig_mod.attention_map(np.full(16, 1 / 16), grid=4, height=40, width=40)
    assert np.allclose(flat, 1.0, atol=1e-5)


def _panel_pixels(fig, ax) -> np.ndarray:
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float)
    box = ax.get_window_extent()
    height = rgba.shape[0]
    top, bottom = int(height - box.y1) + 2, int(height - box.y0) - 2
    return rgba[top:bottom, int(box.x0) + 2:int(box.x1) - 2]


def test_figure_overlays_each_words_map_on_the_image() -> None:
    image = np.full((32, 32, 3), 128, np.uint8)
    attention = np.zeros((2, 2, 16))
    attention[1, 0, 0] = 1.0  # fine stage, first word: the top-left cell
    attention[1, 1, 15] = 1.0  # second word: the bottom-right cell
    fig = fig_mod.attention_figure(image, [["a", "b"], ["red", "circle"]], attention, grid=4, title="t")
    axes = fig.axes
    assert len(axes) == 2 * 3
    first, second = _panel_pixels(fig, axes[4]), _panel_pixels(fig, axes[5])
    h, w = first.shape[:2]
    top_left, bottom_right = (slice(0, h // 4), slice(0, w // 4)), (slice(3 * h // 4, h), slice(3 * w // 4, w))
    # jet: the attended corner turns red, the far corner blue
    assert first[top_left][..., 0].mean() > first[bottom_right][..., 0].mean() + 60
    assert second[bottom_right][..., 0].mean() > second[top_left][..., 0].mean() + 60
    coarse = _panel_pixels(fig, axes[1])  # coarse stage: the plain image
    assert np.abs(coarse - 128).mean() < 5
    assert [ax.get_title() for ax in axes] == ["coarse", "a", "b", "fine 1", "red", "circle"]


def tiny_data(tmp_path: Path) -> dict[str, Path]:
    paths = tiny_files(tmp_path, image_size=48)
    vocab = Vocab.load(paths["vocab.json"])
    options = {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8, "dropout": 0.0}
    for arch in ("stackcap", "fc"):
        torch.manual_seed(0)
        model = build_model(arch, options if arch == "stackcap" else {"embed_size": 8, "hidden_size": 16},
                            len(vocab), 48, 16)
        paths[arch] = tmp_path / f"{arch}.pt"
        checkpoint.save(paths[arch], checkpoint.Checkpoint(run={"model": arch}, vocab_sha256=vocab.sha256,
                                                           modules={"model": checkpoint.model_record(model, arch)}))
    return paths


def args_for(paths: dict[str, Path], tmp_path: Path, arch: str, n: int) -> argparse.Namespace:
    return argparse.Namespace(params=REPO / "params.yaml", dataset="synthetic", checkpoint=paths[arch],
                              annotations=paths["annotations.json"], features=paths["features.h5"],
                              vocab=paths["vocab.json"], labels=paths["labels.h5"], image_root=tmp_path / "images",
                              out_dir=tmp_path / "out", n_images=n)


def test_stage_writes_one_png_per_test_image(tmp_path: Path) -> None:
    paths = tiny_data(tmp_path)
    fig_mod.main(args_for(paths, tmp_path, "stackcap", 2))
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["attention_0.png", "attention_1.png"]  # no temporary files left
    with Image.open(tmp_path / "out" / "attention_0.png") as png:
        assert png.format == "PNG" and png.height > 200  # three stage rows
    with pytest.raises(CaprlError, match="has no attention"):
        fig_mod.main(args_for(paths, tmp_path, "fc", 1))
    with pytest.raises(CaprlError, match="test split has 3 images"):
        fig_mod.main(args_for(paths, tmp_path, "stackcap", 4))
