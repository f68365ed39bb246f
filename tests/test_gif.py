"""GIF decoding: uniform frames as RGB, TGIF's failures classified (probe and sample), and the
TGIF reader's failure policy (skip and list / stop), on GIFs generated here with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from caprl.data.gif import (GifError, GifLimits, decode_all, gif_limits, probe, sample_frames, uniform_indices,
                            video_settings)
from caprl.errors import CaprlError


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


# ----------------------------------------------------------------------------- probe (prepare time)


def noisy(n: int, size: int = 32, seed: int = 0) -> list[Image.Image]:
    """Random frames: LZW cannot squeeze them, so a cut lands inside a frame's data."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).convert("P", palette=Image.ADAPTIVE)
            for _ in range(n)]


def test_probe_counts_frames_and_finds_a_cut_that_n_frames_misses(tmp_path: Path) -> None:
    data = write_gif(tmp_path / "whole.gif", noisy(8)).read_bytes()
    assert probe(tmp_path / "whole.gif") == 8
    half = tmp_path / "half.gif"
    half.write_bytes(data[: len(data) // 2])
    with Image.open(half) as gif:
        assert gif.n_frames >= 2  # the frame walk alone sees an animation...
    with pytest.raises(GifError) as err:  # ...decoding every frame finds the cut
        probe(half)
    assert err.value.kind == "corrupt" and "truncated" in err.value.detail
    mangled = tmp_path / "mangled.gif"  # a cut that makes Pillow raise IndexError, not OSError
    mangled.write_bytes(data[: len(data) * 9 // 10])
    for check in (probe, lambda p: sample_frames(p, 8)):
        with pytest.raises(GifError) as err:
            check(mangled)
        assert err.value.kind == "corrupt"


def test_probe_limits_and_settings(tmp_path: Path) -> None:
    gif = write_gif(tmp_path / "a.gif", coloured(6))
    with pytest.raises(GifError, match=r"too large GIF \(more than 5 frames\)"):
        probe(gif, GifLimits(max_frames=5))
    assert probe(gif, GifLimits(max_frames=6)) == 6
    assert gif_limits({"frames": 8, "on_failure": "skip", "max_mib": 0.5}).max_bytes == 2**19
    assert gif_limits({"max_mib": 1, "max_frames": 3}).max_frames == 3
    assert video_settings(None) == {"frames": 8, "on_failure": "skip", "max_mib": 64, "segments": 1}
    with pytest.raises(CaprlError, match="on_failure must be 'skip' or 'stop'"):
        video_settings({"on_failure": "ignore"})


# ----------------------------------------------------------------------------- the TGIF reader's policy


BROKEN = {  # file -> expected kind; made by broken_gifs
    "tumblr_single_400.gif": "single_frame",
    "tumblr_truncated_400.gif": "corrupt",
    "tumblr_garbage_400.gif": "corrupt",
    "tumblr_bytes_400.gif": "too_large",
    "tumblr_frames_400.gif": "too_large",
}
# small enough that only the two "too large" GIFs break them
LIMITS = {"frames": 4, "on_failure": "skip", "max_mib": 20000 / 2**20, "max_frames": 12}


def broken_tgif(root: Path) -> tuple[Path, Path]:
    """tgif_files plus one GIF of each failure kind and one whose frames change mode (all in train)."""
    raw, gifs = tgif_files(root)
    coloured(1)[0].save(gifs / "tumblr_single_400.gif")
    data = write_gif(root / "whole.gif", noisy(8)).read_bytes()
    (gifs / "tumblr_truncated_400.gif").write_bytes(data[: len(data) // 2])
    (gifs / "tumblr_garbage_400.gif").write_bytes(b"GIF89a" + bytes(range(256)) * 4)
    write_gif(gifs / "tumblr_bytes_400.gif", noisy(3, size=96))  # > 20000 bytes
    write_gif(gifs / "tumblr_frames_400.gif", coloured(13))  # > 12 frames
    write_gif(gifs / "tumblr_modes_400.gif", [Image.new("RGB", (12, 12), (200, 10, 10)).convert("P"),
                                              Image.new("L", (12, 12), 128),
                                              Image.new("RGBA", (12, 12), (10, 200, 10, 255)),
                                              Image.new("RGB", (12, 12), (10, 10, 200))])
    assert (gifs / "tumblr_bytes_400.gif").stat().st_size > LIMITS["max_mib"] * 2**20
    assert all((gifs / f).stat().st_size < LIMITS["max_mib"] * 2**20 for f in BROKEN if "bytes" not in f)
    extra = [*BROKEN, "tumblr_modes_400.gif"]
    url = "https://38.media.tumblr.com/y/{}"
    with raw.open("a") as f:
        f.write("".join(f"{url.format(name)}\ta gif called {name.split('_')[1]} .\n" for name in extra))
    with (root / "train.txt").open("a") as f:
        f.write("".join(url.format(name) + "\n" for name in extra))
    return raw, gifs


def test_tgif_skip_lists_every_broken_gif_and_keeps_the_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from caprl.data.readers import build_reader

    raw, gifs = broken_tgif(tmp_path)
    with caplog.at_level("WARNING", logger="caprl"):
        ann = build_reader("tgif", "clips").read(raw, gifs, "clips", settings=LIMITS)
    skipped = ann["stats"]["skipped_media"]
    assert {s["file"]: s["kind"] for s in skipped} == BROKEN
    assert all(s["detail"] for s in skipped)
    kept = {im["file"] for im in ann["images"]}
    assert kept == {"tumblr_0_400.gif", "tumblr_1_400.gif", "tumblr_2_400.gif", "tumblr_modes_400.gif"}
    assert ann["stats"]["images"] == 4 and ann["stats"]["split_images"] == {"train": 3, "val": 1, "test": 0}
    # ids are positions among all listed GIFs: a skipped GIF leaves its id unused, the others keep theirs
    names = sorted([*BROKEN, "tumblr_modes_400.gif", "tumblr_0_400.gif", "tumblr_1_400.gif", "tumblr_2_400.gif"])
    assert all(im["id"] == names.index(im["file"]) + 1 for im in ann["images"])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for name, kind in BROKEN.items():
        assert sum(name in w and kind.replace("_", " ") in w for w in warnings) == 1
    assert any("skipped 5 of 9 GIFs of clips" in w and "2 corrupt" in w for w in warnings)
    # the GIF whose frames change mode (P, L, RGBA, RGB) was kept and decodes as RGB
    frames = sample_frames(gifs / "tumblr_modes_400.gif", 4)
    assert frames.shape == (4, 12, 12, 3)
    assert frames[0, 0, 0, 0] > 150 and frames[2, 0, 0, 1] > 150 and frames[3, 0, 0, 2] > 150


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_tgif_stop_names_the_file_the_kind_and_what_to_do(tmp_path: Path, name: str) -> None:
    from caprl.data.tgif import read_tgif

    raw, gifs = broken_tgif(tmp_path)
    for other in BROKEN:
        if other != name:
            write_gif(gifs / other, coloured(3))  # repaired: only `name` is broken
    with pytest.raises(GifError) as err:
        read_tgif(raw, gifs, "clips", {**LIMITS, "on_failure": "stop"})
    message = str(err.value)
    assert err.value.kind == BROKEN[name] and isinstance(err.value, CaprlError)
    assert str(gifs / name) in message and BROKEN[name].replace("_", " ") in message
    assert "re-download it" in message and "features.video.on_failure: skip" in message
