"""Video features: per-frame backbone features pooled over time (patches, ResNet-152 at random),
and the real CLIs (prepare -> features per shard -> merge-features) on a tiny TGIF-format folder."""

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

from caprl.data.gif import GifError, GifLimits, sample_frames
from caprl.features import Features
from caprl.features.backbones import PatchesBackbone, build_backbone
from caprl.features.video import extract_video_features, pool_frames
from numerics import mean_atol

REPO = Path(__file__).resolve().parents[1]
FRAMES = 3


def write_gif(path: Path, frames: list[Image.Image]) -> Path:
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=80, loop=0, disposal=2)
    return path


def moving_square(n_frames: int, seed: int, size: int = 32) -> list[Image.Image]:
    """A coloured square moving across a light background, as palette frames."""
    rng = np.random.default_rng(seed)
    colour = rng.integers(0, 256, 3)
    frames = []
    for t in range(n_frames):
        array = np.full((size, size, 3), 230, np.uint8)
        x = (t * 5 + seed) % (size - 10)
        array[8:18, x:x + 10] = colour
        frames.append(Image.fromarray(array).convert("P", palette=Image.ADAPTIVE))
    return frames


def make_videos(root: Path, n: int = 5) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for k in range(n):
        write_gif(root / f"v{k}.gif", moving_square(4 + k, seed=k))
        records.append({"id": 10 + 3 * k, "file": f"v{k}.gif"})
    return records


def per_frame(backbone, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's (pooled, regions) of each sampled frame of one GIF, one frame at a time."""
    outs = [backbone(backbone.preprocess(Image.fromarray(f)).unsqueeze(0)) for f in sample_frames(path, FRAMES)]
    return torch.cat([p for p, _ in outs]), torch.cat([r for _, r in outs])


@pytest.mark.numerics
def test_patches_video_features_are_frame_features_pooled_over_time(tmp_path: Path) -> None:
    records = make_videos(tmp_path / "gifs")
    bb = PatchesBackbone(grid=4, cell_size=4)
    # batch_size counts frames: 7 // 3 = 2 GIFs per backbone call (3 calls for 5 GIFs)
    assert extract_video_features(records, tmp_path / "gifs", bb, tmp_path / "v.h5", batch_size=7, frames=FRAMES,
                                  attrs={"dataset": "clips"}) == 5
    with h5py.File(tmp_path / "v.h5", "r") as h5:
        attrs = dict(h5.attrs)
        pooled, regions, ids = h5["pooled"][:], h5["regions"][:], h5["image_ids"][:]
    assert attrs["media"] == "video" and attrs["frames"] == FRAMES and attrs["n_regions"] == FRAMES
    assert attrs["grid"] == 0 and attrs["backbone"] == "patches" and attrs["dataset"] == "clips"
    assert list(ids) == [r["id"] for r in records]
    assert pooled.shape == (5, 48) and regions.shape == (5, FRAMES, 48)
    for k, record in enumerate(records):
        frame_pooled, frame_regions = per_frame(bb, tmp_path / "gifs" / record["file"])
        # cell means of pixels in [-1, 1] (a 4x4 cell), in batches of other sizes; then over the frames
        assert np.allclose(regions[k], frame_pooled.numpy(), rtol=0, atol=mean_atol(16, 1.0))  # one region per frame
        assert np.allclose(pooled[k], frame_pooled.mean(dim=0).numpy(), rtol=0,
                           atol=mean_atol(16 * FRAMES, 1.0))  # mean over time
    assert not np.allclose(regions[:, 0], regions[:, -1])  # the square moves: frames differ
    with Features(tmp_path / "v.h5") as feats:
        assert (feats.n_regions, feats.dim) == (FRAMES, 48)


@pytest.mark.numerics
def test_resnet152_video_features_are_2048_d_spatio_temporal_means(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bb = build_backbone({"backbone": "resnet152", "resnet": {"pretrained": False, "image_size": 64, "grid": 1}})
    bb.device = torch.device("cpu")
    bb.model = bb.model.to(bb.device)
    records = make_videos(tmp_path / "gifs", n=2)
    batch = torch.stack([bb.preprocess(Image.fromarray(f))
                         for r in records for f in sample_frames(tmp_path / "gifs" / r["file"], FRAMES)])
    pooled, regions = pool_frames(bb, batch, FRAMES)
    assert pooled.shape == (2, 2048) and regions.shape == (2, FRAMES, 2048)
    fmap = bb.feature_map(batch).cpu()  # [6, 2048, 2, 2]
    spatial = fmap.mean(dim=(2, 3)).view(2, FRAMES, 2048)
    m = float(fmap.abs().max())  # means of the same map by other kernels (tests/numerics.py)
    assert torch.allclose(regions, spatial, rtol=0, atol=mean_atol(4, m))  # each frame's spatial mean
    assert torch.allclose(pooled, fmap.view(2, FRAMES, 2048, -1).mean(dim=(1, 3)), rtol=0,
                          atol=mean_atol(4 * FRAMES, m))  # space and time
    extract_video_features(records, tmp_path / "gifs", bb, tmp_path / "r.h5", batch_size=FRAMES, frames=FRAMES)
    with Features(tmp_path / "r.h5") as feats:
        assert feats.backbone == "resnet152" and feats.dim == 2048 and feats.attrs["media"] == "video"
        p, r = feats.get([records[1]["id"], records[0]["id"]])
        assert torch.allclose(p, pooled.flip(0), atol=1e-4) and torch.allclose(r, regions.flip(0), atol=1e-4)


def test_a_gif_that_fails_at_extraction_names_the_file_and_the_kind(tmp_path: Path) -> None:
    records = make_videos(tmp_path / "gifs", n=3)
    bb = PatchesBackbone(grid=2, cell_size=2)
    Image.new("P", (8, 8)).save(tmp_path / "gifs" / "v1.gif")  # broken since prepare: a still image
    with pytest.raises(GifError) as err:
        extract_video_features(records, tmp_path / "gifs", bb, tmp_path / "x.h5", batch_size=8, frames=FRAMES)
    assert err.value.kind == "single_frame" and "v1.gif" in str(err.value) and "video id 13" in str(err.value)
    assert "re-run caprl prepare" in str(err.value) and not (tmp_path / "x.h5").exists()
    with pytest.raises(GifError, match="too large"):
        extract_video_features(records[:1], tmp_path / "gifs", bb, tmp_path / "x.h5", batch_size=8, frames=FRAMES,
                               limits=GifLimits(max_frames=2))


# ----------------------------------------------------------------------------- CLI (real subprocesses)


def tgif_folder(root: Path) -> tuple[Path, Path]:
    """TSV + train/val/test.txt + GIFs: 7 good GIFs and a truncated one (in train)."""
    gifs = root / "raw" / "gifs"
    gifs.mkdir(parents=True)
    url = "https://33.media.tumblr.com/{}/tumblr_{}_500.gif"
    splits = {"train": [0, 1, 2, 3, 7], "val": [4, 5], "test": [6]}
    lines = []
    for k in range(8):
        write_gif(gifs / f"tumblr_{k}_500.gif", moving_square(3 + k % 3, seed=k))
        lines += [f"{url.format(k, k)}\ta square moves to the right .\n", f"{url.format(k, k)}\ta box slides .\n"]
    data = (gifs / "tumblr_7_500.gif").read_bytes()
    (gifs / "tumblr_7_500.gif").write_bytes(data[: len(data) * 2 // 3])
    (root / "raw" / "tgif-v1.0.tsv").write_text("".join(lines))
    for split, ks in splits.items():
        (root / "raw" / f"{split}.txt").write_text("".join(url.format(k, k) + "\n" for k in ks))
    return root / "raw" / "tgif-v1.0.tsv", gifs


def run_caprl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CAPRL_PARAMS_SCHEMA=str(REPO / "workflow" / "schemas" / "params.schema.yaml"))
    return subprocess.run([sys.executable, "-m", "caprl", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.numerics
def test_cli_prepare_features_merge_on_a_tgif_folder(tmp_path: Path) -> None:
    raw, gifs = tgif_folder(tmp_path)
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["datasets"]["clips"] = {"format": "tgif", "raw": "raw/tgif-v1.0.tsv", "media_root": "raw/gifs",
                                   "generate": False, "backbone": "patches", "enabled": False}
    params["features"].update(shards=[0, 1], batch_size=2 * FRAMES, num_threads=1)
    params["features"]["video"].update(frames=FRAMES, on_failure="skip")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")

    done = run_caprl(tmp_path, "prepare", "--params", "params.yaml", "--dataset", "clips", "--out", "ann.json")
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stderr and "tumblr_7_500.gif: corrupt GIF" in done.stderr
    ann = json.loads((tmp_path / "ann.json").read_text())
    assert [s["file"] for s in ann["stats"]["skipped_media"]] == ["tumblr_7_500.gif"]
    assert ann["stats"]["skipped_media"][0]["kind"] == "corrupt"
    assert [im["id"] for im in ann["images"]] == [1, 2, 3, 4, 5, 6, 7]
    assert ann["stats"]["split_images"] == {"train": 4, "val": 2, "test": 1}

    common = ["--params", "params.yaml", "--dataset", "clips", "--annotations", "ann.json", "--image-root", "raw/gifs"]
    for shard in (0, 1):
        done = run_caprl(tmp_path, "features", *common, "--shard", str(shard), "--out", f"feats/shard{shard}.h5")
        assert done.returncode == 0, done.stderr
    done = run_caprl(tmp_path, "merge-features", "--params", "params.yaml", "--annotations", "ann.json",
                     "--shard-dir", "feats", "--out", "clips.h5")
    assert done.returncode == 0, done.stderr
    with Features(tmp_path / "clips.h5") as feats:
        assert list(feats.image_ids) == [1, 2, 3, 4, 5, 6, 7]
        assert feats.attrs["media"] == "video" and feats.attrs["frames"] == FRAMES
        pooled, regions = feats.get([1, 7])
        assert pooled.shape == (2, 48) and regions.shape == (2, FRAMES, 48)
        assert torch.allclose(pooled, regions.mean(dim=1), rtol=0, atol=mean_atol(FRAMES, float(regions.abs().max())))

    params["features"]["video"]["on_failure"] = "stop"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    done = run_caprl(tmp_path, "prepare", "--params", "params.yaml", "--dataset", "clips", "--out", "ann2.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tumblr_7_500.gif: corrupt GIF" in done.stderr and "features.video.on_failure: skip" in done.stderr
    assert not (tmp_path / "ann2.json").exists()
