"""GIF decoding (issue 10's first slice): uniform frames as RGB, and TGIF's failures
classified, on GIFs generated here with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from caprl.data.gif import GifError, GifLimits, decode_all, sample_frames, uniform_indices


def write_gif(path: Path, frames: list[Image.Image]) -> Path:
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=80, loop=0, disposal=2)
    return path


def coloured(n: int, size: int = 16, mode: str = "P") -> list[Image.Image]:
    """Frame k is filled with grey level 20 * k (so a frame's index can be read back)."""
    rgb = [Image.new("RGB", (size, size), (20 * k, 20 * k, 20 * k)) for k in range(n)]
    return [im.convert("P", palette=Image.ADAPTIVE) if mode == "P" else im.convert(mode) for im in rgb]


def test_uniform_indices_cover_the_animation() -> None:
    assert uniform_indices(10, 4) == [0, 3, 6, 9]
    assert uniform_indices(3, 5) == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError):
        uniform_indices(0, 3)


def test_frames_are_sampled_uniformly_as_rgb(tmp_path: Path) -> None:
    gif = write_gif(tmp_path / "a.gif", coloured(10))
    frames = sample_frames(gif, 4)
    assert frames.shape == (4, 16, 16, 3) and frames.dtype == np.uint8
    assert [int(f[0, 0, 0]) for f in frames] == [0, 60, 120, 180]
    assert sample_frames(gif, 3, size=8).shape == (3, 8, 8, 3)


def test_frames_that_change_mode_all_come_back_rgb(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (12, 12), (200, 10, 10)).convert("P"),
              Image.new("L", (12, 12), 128),
              Image.new("RGBA", (12, 12), (10, 200, 10, 255))]
    out = sample_frames(write_gif(tmp_path / "modes.gif", frames), 3)
    assert out.shape == (3, 12, 12, 3)
    assert out[2, 0, 0, 1] > out[2, 0, 0, 0]  # the green frame is green


@pytest.mark.parametrize("kind", ["single_frame", "truncated", "garbage", "too_large_bytes", "too_large_pixels"])
def test_each_failure_has_its_kind_and_names_the_file(tmp_path: Path, kind: str) -> None:
    path, limits, expected = tmp_path / f"{kind}.gif", GifLimits(), kind
    if kind == "single_frame":
        coloured(1)[0].save(path)
    elif kind == "truncated":
        data = write_gif(tmp_path / "whole.gif", coloured(8, size=32)).read_bytes()
        path.write_bytes(data[: len(data) // 3])
        expected = "corrupt"
    elif kind == "garbage":
        path.write_bytes(b"GIF89a" + bytes(range(256)) * 4)
        expected = "corrupt"
    elif kind == "too_large_bytes":
        write_gif(path, coloured(4))
        limits, expected = GifLimits(max_bytes=10), "too_large"
    else:
        write_gif(path, coloured(4))
        limits, expected = GifLimits(max_pixels=100), "too_large"
    with pytest.raises(GifError) as err:
        sample_frames(path, 4, limits=limits)
    assert err.value.kind == expected and str(path) in str(err.value)


def test_decode_all_skips_and_lists_or_stops(tmp_path: Path) -> None:
    good = write_gif(tmp_path / "good.gif", coloured(5))
    still = tmp_path / "still.gif"
    coloured(1)[0].save(still)
    frames, report = decode_all([good, still], 2)
    assert list(frames) == [str(good)] and report.skipped == {str(still): ("single_frame", "a still image, not an animation")}
    assert report.lines() == [f"{still}\tsingle_frame\ta still image, not an animation"]
    with pytest.raises(GifError, match="still.gif: single frame GIF"):
        decode_all([good, still], 2, policy="stop")


def tgif_files(root: Path) -> tuple[Path, Path]:
    """A TGIF-format dataset: TSV, the three split lists, and the GIFs named by URL."""
    gifs = root / "gifs"
    gifs.mkdir()
    url = "https://38.media.tumblr.com/x{k}/tumblr_{k}_400.gif"
    rows = [(0, "a red square moves to the left ."), (0, "a square is moving ."), (1, "a circle grows ."),
            (2, "a blue triangle appears ."), (3, "not in a split .")]
    (root / "tgif-v1.0.tsv").write_text("".join(f"{url.format(k=k)}\t{s}\n" for k, s in rows))
    for split, ks in (("train", [0, 1]), ("val", [2]), ("test", [])):
        (root / f"{split}.txt").write_text("".join(url.format(k=k) + "\n" for k in ks))
    for k in range(4):
        write_gif(gifs / f"tumblr_{k}_400.gif", coloured(3))
    return root / "tgif-v1.0.tsv", gifs


def test_tgif_reader_reads_sentences_splits_and_gifs(tmp_path: Path) -> None:
    from caprl.data.tgif import read_tgif

    raw, gifs = tgif_files(tmp_path)
    ann = read_tgif(raw, gifs, "tgif")
    assert [(im["id"], im["file"], im["split"]) for im in ann["images"]] == [
        (1, "tumblr_0_400.gif", "train"), (2, "tumblr_1_400.gif", "train"), (3, "tumblr_2_400.gif", "val")]
    assert ann["images"][0]["captions"] == [["a", "red", "square", "moves", "to", "the", "left"],
                                            ["a", "square", "is", "moving"]]
    assert ann["stats"]["not_in_a_split"] == 1 and ann["stats"]["split_images"] == {"train": 2, "val": 1, "test": 0}


def test_tgif_reader_names_a_missing_gif_and_a_bad_line(tmp_path: Path) -> None:
    from caprl.data.tgif import read_tgif
    from caprl.errors import CaprlError

    raw, gifs = tgif_files(tmp_path)
    (gifs / "tumblr_1_400.gif").unlink()
    with pytest.raises(CaprlError, match=r"1 of 3 GIFs are missing .*tumblr_1_400.gif"):
        read_tgif(raw, gifs, "tgif")
    raw.write_text(raw.read_text() + "no tab here\n")
    with pytest.raises(CaprlError, match=r"tgif-v1.0.tsv:6: expected"):
        read_tgif(raw, gifs, "tgif")
