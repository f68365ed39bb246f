"""The synthetic video dataset: TGIF format, determinism, events visible in the frames, sentence grammar."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from caprl.data import SPLITS, synthetic_video as sv
from caprl.data.gif import sample_frames
from caprl.data.karpathy import tokenize
from caprl.data.synthetic import COLOUR_RGB
from caprl.data.tgif import read_tgif
from caprl.errors import CaprlError

SMALL = {"n_train": 6, "n_val": 2, "n_test": 2, "image_size": 32, "max_objects": 3, "frames": 6}
EVENT_WORDS = {
    "grow": {"grows", "growing", "bigger"},
    "shrink": {"shrinks", "shrinking", "smaller"},
    "appear": {"appears", "appearing", "pops", "popping", "shows", "showing", "comes", "coming"},
}


def write(root: Path, seed: int = 5, dataset: str = "tgif_synth", cfg: dict | None = None) -> tuple[Path, Path]:
    out_tsv, gif_dir = root / "raw" / "tgif.tsv", root / "gifs"
    cfg = cfg or SMALL
    stats = sv.write_video_dataset(cfg, seed, dataset, out_tsv, gif_dir)
    n = {s: cfg[f"n_{s}"] for s in SPLITS}
    assert stats == {"videos": sum(n.values()), **n, "sentences": 3 * sum(n.values()), "frames": cfg["frames"]}
    return out_tsv, gif_dir


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_written_dataset_reads_back_as_tgif(tmp_path: Path) -> None:
    out_tsv, gif_dir = write(tmp_path)
    data = read_tgif(out_tsv, gif_dir, "tgif_synth")
    images = data["images"]
    assert data["stats"]["split_images"] == {"train": 6, "val": 2, "test": 2}
    assert data["stats"]["not_in_a_split"] == 0 and data["stats"]["empty_captions_dropped"] == 0
    assert sorted(p.name for p in gif_dir.iterdir()) == sorted(im["file"] for im in images)
    assert [im["id"] for im in images] == list(range(1, 11))
    listed = [line for s in SPLITS for line in (out_tsv.parent / f"{s}.txt").read_text().splitlines()]
    assert len(listed) == len(set(listed)) == 10  # every GIF in exactly one split
    assert all(url.startswith("https://synthetic.caprl.invalid/tgif_synth/") for url in listed)
    samples = {s.name: s for s in sv.generate_videos(SMALL, 5, "tgif_synth")}
    for im in images:
        sample = samples[im["file"]]
        assert im["split"] == sample.split and im["file"] == f"tgif_synth_{sample.split}_{sample.index:06d}.gif"
        assert im["raw"] == sample.sentences and len(im["captions"]) == 3 == len(set(im["raw"]))
        assert all(caption == raw.split() for caption, raw in zip(im["captions"], im["raw"]))
        path = gif_dir / im["file"]
        with Image.open(path) as gif:
            assert gif.n_frames == 6 and gif.info.get("loop") == 0
        frames = sample_frames(path, 6)
        assert frames.shape == (6, 32, 32, 3)
        # the palette is exact: the GIF decodes to the rendered frames
        assert np.array_equal(frames, np.stack([np.asarray(f) for f in sample.frames]))
    # ids are stable: a second write gives the same annotations
    again = read_tgif(*write(tmp_path / "again"), "tgif_synth")
    assert again["images"] == images


def test_same_seed_is_byte_identical_and_other_seed_or_name_differs(tmp_path: Path) -> None:
    a_tsv, a_dir = write(tmp_path / "a")
    b_tsv, b_dir = write(tmp_path / "b")
    c_tsv, c_dir = write(tmp_path / "c", seed=6)
    assert tree_bytes(a_tsv.parent) == tree_bytes(b_tsv.parent)  # TSV and split lists
    assert tree_bytes(a_dir) == tree_bytes(b_dir) and len(tree_bytes(a_dir)) == 10
    assert a_tsv.read_bytes() != c_tsv.read_bytes()
    a_gifs, c_gifs = tree_bytes(a_dir), tree_bytes(c_dir)
    assert sum(a_gifs[k] != c_gifs[k] for k in a_gifs) >= 9
    other = [s.sentences for s in sv.generate_videos(SMALL, 5, "other_name")]
    assert other != [s.sentences for s in sv.generate_videos(SMALL, 5, "tgif_synth")]


def test_val_and_test_do_not_depend_on_n_train() -> None:
    more = dict(SMALL, n_train=9)
    a = [(s.name, s.sentences) for s in sv.generate_videos(SMALL, 5, "d") if s.split != "train"]
    b = [(s.name, s.sentences) for s in sv.generate_videos(more, 5, "d") if s.split != "train"]
    assert a == b


def pixels(frame: Image.Image | np.ndarray) -> np.ndarray:
    """Mask of the object pixels (the background is the frame's median colour)."""
    rgb = np.asarray(frame).astype(int)
    background = np.median(rgb.reshape(-1, 3), axis=0)
    return np.abs(rgb - background).sum(-1) > 40


def centre(mask: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(mask)
    return float(xs.mean()), float(ys.mean())


def dominant_colour(frame: Image.Image) -> str:
    mean = np.asarray(frame).astype(int)[pixels(frame)].mean(0)
    return min(COLOUR_RGB, key=lambda c: float(np.abs(np.array(COLOUR_RGB[c]) - mean).sum()))


def test_events_are_visible_in_the_frames_and_named_by_the_sentences() -> None:
    """Single-object videos, so the object's pixels are all the non-background pixels."""
    cfg = {"n_train": 120, "n_val": 0, "n_test": 0, "image_size": 32, "max_objects": 1, "frames": 6}
    seen = set()
    for s in sv.generate_videos(cfg, 11, "events"):
        e, first, last = s.event, s.frames[0], s.frames[-1]
        words = [set(sentence.split()) for sentence in s.sentences]
        assert all(e.actor.colour in w or e.kind == "colour" for w in words)
        if e.kind == "move":
            (x0, y0), (x1, y1) = centre(pixels(first)), centre(pixels(last))
            axis, sign = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}[e.direction]
            assert sign * ((x1, y1)[axis] - (x0, y0)[axis]) > 5  # at least 5 px of the 32
            assert abs((x1, y1)[1 - axis] - (x0, y0)[1 - axis]) < 2
            assert all(e.direction in w for w in words)
            seen.add(e.direction)
        elif e.kind in ("grow", "shrink"):
            a0, a1 = int(pixels(first).sum()), int(pixels(last).sum())
            assert (a1 > 1.8 * a0) if e.kind == "grow" else (a0 > 1.8 * a1)
            areas = [int(pixels(f).sum()) for f in s.frames]
            assert areas == sorted(areas, reverse=e.kind == "shrink")
            assert all(w & EVENT_WORDS[e.kind] for w in words)
        elif e.kind == "colour":
            assert dominant_colour(first) == e.colour_from != e.colour_to == dominant_colour(last)
            assert 1 <= e.change_frame < len(s.frames)
            assert dominant_colour(s.frames[e.change_frame - 1]) == e.colour_from
            assert dominant_colour(s.frames[e.change_frame]) == e.colour_to
            assert all(e.colour_to in w for w in words)
        else:
            assert e.kind == "appear"
            assert not pixels(first).any() and pixels(last).sum() > 20
            assert s.track[0] is None and s.track[-1] is not None
            assert all(w & EVENT_WORDS["appear"] for w in words)
        seen.add(e.kind)
    assert seen == set(sv.EVENT_KINDS) | set(sv.DIRECTIONS)


def test_scenes_are_unambiguous_and_the_others_stay_still() -> None:
    cfg = {"n_train": 150, "n_val": 0, "n_test": 0, "image_size": 32, "max_objects": 3, "frames": 2}
    n_objects = set()
    for s in sv.generate_videos(cfg, 3, "scenes"):
        e = s.event
        states = {(e.actor.shape, e.actor.colour), (e.end.shape, e.end.colour)}
        names = [(o.shape, o.colour) for o in s.others]
        assert len(set(names)) == len(names) and not states & set(names)
        assert len({(o.col, o.row) for o in s.others} | {(e.actor.col, e.actor.row)}) == len(s.others) + 1
        n_objects.add(len(s.others) + 1)
        present = [t for t in s.track if t is not None]
        if e.kind != "move":
            assert len({t.centre for t in present}) == 1
        # the still objects: frames differ only around the actor (its path's bounding box)
        xs = [t.centre[0] for t in present]
        ys = [t.centre[1] for t in present]
        h = max(t.half_size for t in present) + 0.01
        box = (np.array([min(xs) - h, min(ys) - h, max(xs) + h, max(ys) + h]) * 32).round().astype(int)
        changed = np.abs(np.asarray(s.frames[0]).astype(int) - np.asarray(s.frames[-1]).astype(int)).sum(-1) > 3
        ys_c, xs_c = np.nonzero(changed)
        assert ((xs_c >= box[0] - 1) & (xs_c <= box[2] + 1) & (ys_c >= box[1] - 1) & (ys_c <= box[3] + 1)).all()
    assert n_objects == {1, 2, 3}


def test_grammar_has_several_phrasings_per_event() -> None:
    cfg = {"n_train": 300, "n_val": 0, "n_test": 0, "image_size": 32, "max_objects": 3, "frames": 2}
    templates, verbs = defaultdict(set), defaultdict(set)
    for s in sv.generate_videos(cfg, 1, "grammar"):
        assert len(s.sentences) == len(set(s.sentences)) == 3 == len(set(s.templates))
        for sentence, template in zip(s.sentences, s.templates):
            assert sentence == sentence.lower() and tokenize(sentence) == sentence.split()
            assert "\t" not in sentence and "\n" not in sentence
            templates[s.event.kind].add(template)
            verbs[s.event.kind].add(" ".join(w for w in sentence.split() if w not in
                                             {s.event.actor.colour, s.event.actor.shape}))
    assert set(templates) == set(sv.EVENT_KINDS)
    assert all(len(t) >= 4 for t in templates.values()), templates
    assert all(len(v) >= 20 for v in verbs.values())


def test_bad_settings_and_tsv_inside_gif_dir_are_errors(tmp_path: Path) -> None:
    for bad in ({"image_size": 16}, {"max_objects": 4}, {"frames": 1}):
        with pytest.raises(CaprlError):
            next(sv.generate_videos(dict(SMALL, **bad), 0, "d"))
    with pytest.raises(CaprlError, match="frames"):
        next(sv.generate_videos({k: v for k, v in SMALL.items() if k != "frames"}, 0, "d"))
    with pytest.raises(CaprlError):
        next(sv.generate_videos(SMALL, 0, "a/b"))
    with pytest.raises(CaprlError, match="inside"):
        sv.write_video_dataset(SMALL, 0, "d", tmp_path / "gifs" / "x.tsv", tmp_path / "gifs")
    # a failed write leaves no GIF folder and no leftovers
    assert not (tmp_path / "gifs").exists() and not list(tmp_path.iterdir())
