"""The built-in synthetic VIDEO dataset: short GIFs of the synthetic shapes, in the TGIF format.

Each video shows 1..max_objects objects of :mod:`caprl.data.synthetic` (same shapes, colours,
sizes, layout grid and renderer) on a grey background. One object, the *actor*, does one
EVENT over the ``frames`` frames; the others stay still:

* ``move``: slides one or two layout cells ``left`` / ``right`` / ``up`` / ``down``;
* ``grow`` (small -> large) or ``shrink`` (large -> small), steadily over the frames;
* ``colour``: switches from one colour to another at a frame in the middle half;
* ``appear``: absent in the first frames, present from a frame in the middle half on.

No two objects share shape and colour in any state of the event (e.g. a square turning red
never meets another red square), so every sentence names its object unambiguously. The
background shifts by one grey level every other frame (invisible), so that no two
consecutive frames are identical and Pillow keeps all ``frames`` frames in the GIF (its
writer merges identical consecutive frames).

Sentences (3 per GIF, TGIF style: lower case, no final full stop) come from the templates of
:data:`TEMPLATES` with the synonyms of :mod:`caprl.data.grammar`; each event kind has several
verb phrases (``moves to the left`` / ``is sliding left`` / ``rises up``, ``turns green`` /
``changes colour to green``, ``gets bigger``, ``pops up``...) and every sentence names the
event (the direction, the new colour, a verb of growing, shrinking or appearing).
For example: ``a red square moves to the left``, ``the small red square is sliding left``,
``a blue circle suddenly turns green``, ``a green triangle appears next to a red circle``.

Everything is a function of ``seed``, the dataset's name and the cfg: video ``i`` of split
``s`` draws its scene from ``default_rng([seed, crc32(name), s, i, 0])`` and its sentences
from ``[..., 1]``, so another seed or name gives other data and changing ``n_train`` leaves
the val/test videos unchanged. Output, as :func:`caprl.data.tgif.read_tgif` reads it::

    <gif-dir>/<dataset>_<split>_<index:06d>.gif          animated, loop=0, 100 ms a frame
    <out-tsv>                                             <url>\\t<sentence>, 3 lines a GIF
    <out-tsv's folder>/train.txt, val.txt, test.txt       one URL a line
    url = https://synthetic.caprl.invalid/<dataset>/<gif file name>
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
from PIL import Image

from caprl import io
from caprl.data import SPLITS
from caprl.data.grammar import (COLOURS, SHAPE_WORDS, SHAPES, SceneObject, article, location, noun_phrase,
                                pick, relation, salience_order)
from caprl.data.synthetic import (BACKGROUND, CELL_CENTRES, COLOUR_RGB, HALF_SIZE, SPLIT_CODES, Scene,
                                  _compatible, atomic_directory, name_key, render)
from caprl.errors import CaprlError

EVENT_KINDS: tuple[str, ...] = ("move", "grow", "shrink", "colour", "appear")
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
N_SENTENCES = 3
FRAME_MS = 100  # duration of every frame
URL_ROOT = "https://synthetic.caprl.invalid"
_STEP = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


@dataclass(frozen=True)
class Event:
    """What happens: ``actor`` (its state in frame 0; for ``appear``, once present) does ``kind``."""

    kind: str  # one of EVENT_KINDS
    actor: SceneObject
    direction: Optional[str] = None  # move: one of DIRECTIONS
    colour_from: Optional[str] = None  # colour
    colour_to: Optional[str] = None  # colour
    end: Optional[SceneObject] = None  # the actor's state in the last frame
    change_frame: int = 0  # colour / appear: the first frame showing the new colour / the actor


@dataclass(frozen=True)
class ActorState:
    """The actor's geometry in one frame (fractions of the frame side), for checks."""

    centre: tuple[float, float]
    half_size: float
    colour: str
    rgb: tuple[int, int, int]


@dataclass(frozen=True)
class VideoSample:
    name: str  # the GIF's file name
    url: str
    split: str
    index: int  # position in its split
    sentences: list[str]
    templates: list[str]  # the template name of each sentence
    frames: list[Image.Image]  # RGB
    event: Event
    others: tuple[SceneObject, ...]  # the still objects
    track: list[Optional[ActorState]]  # the actor in each frame (None: absent)


def _states(event: Event) -> list[SceneObject]:
    """Every state the actor passes through (cells on its path, both sizes, both colours)."""
    a, b = event.actor, event.end or event.actor
    if event.kind != "move":
        return [a, b]
    dc, dr = _STEP[event.direction or "left"]
    steps = max(abs(b.col - a.col), abs(b.row - a.row))
    return [dataclasses.replace(a, col=a.col + k * dc, row=a.row + k * dr) for k in range(steps + 1)]


def _draw_event(rng: np.random.Generator, frames: int) -> Event:
    kind = EVENT_KINDS[int(rng.integers(len(EVENT_KINDS)))]
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    colour = COLOURS[int(rng.integers(len(COLOURS)))]
    size = ("small", "large")[int(rng.integers(2))]
    col, row = int(rng.integers(3)), int(rng.integers(3))
    lo = max(1, frames // 4)
    change = int(rng.integers(lo, max(lo, min(frames - 1, (3 * frames) // 4)) + 1))
    if kind == "move":
        direction = DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]
        dc, dr = _STEP[direction]
        # start on a cell with room to move, travel 1 or 2 cells
        if dc:
            col = int(rng.integers(1, 3)) if dc < 0 else int(rng.integers(0, 2))
            end_col = int(rng.integers(0, col)) if dc < 0 else int(rng.integers(col + 1, 3))
            end_row = row
        else:
            row = int(rng.integers(1, 3)) if dr < 0 else int(rng.integers(0, 2))
            end_row = int(rng.integers(0, row)) if dr < 0 else int(rng.integers(row + 1, 3))
            end_col = col
        actor = SceneObject(shape, colour, size, col, row)
        return Event(kind, actor, direction=direction, end=dataclasses.replace(actor, col=end_col, row=end_row))
    if kind in ("grow", "shrink"):
        start, end = ("small", "large") if kind == "grow" else ("large", "small")
        actor = SceneObject(shape, colour, start, col, row)
        return Event(kind, actor, end=dataclasses.replace(actor, size=end))
    actor = SceneObject(shape, colour, size, col, row)
    if kind == "colour":
        new = [c for c in COLOURS if c != colour][int(rng.integers(len(COLOURS) - 1))]
        return Event(kind, actor, colour_from=colour, colour_to=new, end=dataclasses.replace(actor, colour=new),
                     change_frame=change)
    return Event(kind, actor, end=actor, change_frame=change)


def _jitter_rgb(rng: np.random.Generator, colour: str) -> tuple[int, int, int]:
    rgb = np.clip(np.array(COLOUR_RGB[colour]) + rng.integers(-12, 13, 3), 0, 255)
    return tuple(int(c) for c in rgb)  # type: ignore[return-value]


def _centre(rng: np.random.Generator, obj: SceneObject) -> tuple[float, float]:
    return (CELL_CENTRES[obj.col] + rng.uniform(-0.02, 0.02), CELL_CENTRES[obj.row] + rng.uniform(-0.02, 0.02))


def sample_video(rng: np.random.Generator, max_objects: int, frames: int, image_size: int
                 ) -> tuple[Event, tuple[SceneObject, ...], list[Image.Image], list[Optional[ActorState]]]:
    """An event, the still objects, the RGB frames and the actor's track."""
    event = _draw_event(rng, frames)
    states = _states(event)
    n_objects = int(rng.integers(1, max_objects + 1))
    others: list[SceneObject] = []
    while len(others) < n_objects - 1:
        candidate = SceneObject(SHAPES[int(rng.integers(len(SHAPES)))], COLOURS[int(rng.integers(len(COLOURS)))],
                                ("small", "large")[int(rng.integers(2))], int(rng.integers(3)), int(rng.integers(3)))
        if _compatible(candidate, others + states):
            others.append(candidate)
    # still objects: geometry as synthetic.sample_scene draws it
    o_centres = [_centre(rng, o) for o in others]
    o_halves = [HALF_SIZE[o.size] * rng.uniform(0.92, 1.08) for o in others]
    o_rgbs = [_jitter_rgb(rng, o.colour) for o in others]
    background = tuple(c + int(rng.integers(-8, 9)) for c in BACKGROUND)
    # the actor: start and end geometry, interpolated over the frames
    end = event.end or event.actor
    c0, c1 = _centre(rng, event.actor), _centre(rng, end)
    if event.kind != "move":
        c1 = c0
    scale = rng.uniform(0.92, 1.08)
    h0, h1 = HALF_SIZE[event.actor.size] * scale, HALF_SIZE[end.size] * scale
    rgb0, rgb1 = _jitter_rgb(rng, event.actor.colour), _jitter_rgb(rng, end.colour)
    images: list[Image.Image] = []
    track: list[Optional[ActorState]] = []
    for t in range(frames):
        f = t / (frames - 1)
        after = t >= event.change_frame if event.kind in ("colour", "appear") else True
        state: Optional[ActorState] = None
        objects, centres, halves, rgbs = list(others), list(o_centres), list(o_halves), list(o_rgbs)
        if event.kind != "appear" or after:
            half = h0 + (h1 - h0) * f
            obj = event.actor
            if event.kind in ("grow", "shrink") and abs(half - h1) < abs(half - h0):
                obj = end  # drawn in the size class it is closer to
            colour, rgb = (end.colour, rgb1) if event.kind == "colour" and after else (obj.colour, rgb0)
            state = ActorState((c0[0] + (c1[0] - c0[0]) * f, c0[1] + (c1[1] - c0[1]) * f), half, colour, rgb)
            objects.append(dataclasses.replace(obj, colour=colour))
            centres.append(state.centre)
            halves.append(half)
            rgbs.append(rgb)
        shade = tuple(c + (t % 2) for c in background)  # consecutive frames always differ
        scene = Scene(tuple(objects), tuple(centres), tuple(halves), tuple(rgbs), shade)  # type: ignore[arg-type]
        images.append(render(scene, image_size))
        track.append(state)
    return event, tuple(others), images, track


# ---------------------------------------------------------------- sentences
# verb phrases: (present simple, gerund); every one names the event
VERBS: dict[str, list[tuple[str, str]]] = {
    "left": [("moves to the left", "moving to the left"), ("moves left", "moving left"),
             ("slides left", "sliding left"), ("goes to the left", "going to the left")],
    "right": [("moves to the right", "moving to the right"), ("moves right", "moving right"),
              ("slides right", "sliding right"), ("goes to the right", "going to the right")],
    "up": [("moves up", "moving up"), ("rises up", "rising up"), ("goes up", "going up"),
           ("slides up", "sliding up")],
    "down": [("moves down", "moving down"), ("falls down", "falling down"), ("goes down", "going down"),
             ("slides down", "sliding down")],
    "grow": [("grows", "growing"), ("gets bigger", "getting bigger"), ("grows larger", "growing larger"),
             ("becomes bigger", "becoming bigger")],
    "shrink": [("shrinks", "shrinking"), ("gets smaller", "getting smaller"),
               ("becomes smaller", "becoming smaller"), ("shrinks in size", "shrinking in size")],
    "colour": [("turns {to}", "turning {to}"), ("changes colour to {to}", "changing colour to {to}"),
               ("becomes {to}", "becoming {to}"), ("changes to {to}", "changing to {to}")],
    "appear": [("appears", "appearing"), ("pops up", "popping up"), ("shows up", "showing up"),
               ("comes into view", "coming into view")],
}
ADVERBS = {"move": "slowly", "grow": "slowly", "shrink": "steadily", "colour": "suddenly", "appear": "suddenly"}
Template = Callable[[Event, list[SceneObject], np.random.Generator], str]


def _verb(e: Event, r: np.random.Generator) -> tuple[str, str]:
    options = VERBS[e.direction if e.kind == "move" else e.kind]
    simple, gerund = options[int(r.integers(len(options)))]
    return simple.format(to=e.colour_to), gerund.format(to=e.colour_to)


def _a(o: SceneObject, r: np.random.Generator) -> str:
    return noun_phrase(o, r, size_prob=0.4)


def _the(o: SceneObject, r: np.random.Generator) -> str:
    return f"the {noun_phrase(o, r, size_prob=0.4, det=False)}"


def _still(others: list[SceneObject], r: np.random.Generator) -> str:
    if len(others) == 2 and r.random() < 0.5:
        return "the other shapes stay still"
    return f"{_a(others[0], r)} {pick(r, [('stays still', 0.6), ('does not move', 0.4)])}"


def _shape_phrase(o: SceneObject, r: np.random.Generator) -> str:
    word = pick(r, SHAPE_WORDS[o.shape])
    return f"{article(word)} {word}"


def _located(e: Event, r: np.random.Generator) -> str:
    if e.kind == "appear":  # "a red square appears in the top left corner"
        return f"{_a(e.actor, r)} {_verb(e, r)[0]} {location(e.actor, r)}"
    return f"{_a(e.actor, r)} {location(e.actor, r)} {_verb(e, r)[0]}"


TEMPLATES: dict[str, tuple[Callable[[Event, list[SceneObject]], bool], Template]] = {
    "simple": (lambda e, o: True, lambda e, o, r: f"{_a(e.actor, r)} {_verb(e, r)[0]}"),
    "progressive": (lambda e, o: True, lambda e, o, r: f"{_the(e.actor, r)} is {_verb(e, r)[1]}"),
    "adverb": (lambda e, o: True, lambda e, o, r: f"{_a(e.actor, r)} {ADVERBS[e.kind]} {_verb(e, r)[0]}"),
    "clip": (lambda e, o: True, lambda e, o, r: f"{pick(r, [('a gif', 0.5), ('a video', 0.5)])} of "
             f"{_a(e.actor, r)} {_verb(e, r)[1]}"),
    "across": (lambda e, o: e.kind == "move",
               lambda e, o, r: f"{_a(e.actor, r)} {_verb(e, r)[0]} across the "
               f"{pick(r, [('frame', 0.5), ('screen', 0.5)])}"),
    "from_to": (lambda e, o: e.kind == "colour",
                lambda e, o, r: f"{_shape_phrase(e.actor, r)} changes from {e.colour_from} to {e.colour_to}"),
    "located": (lambda e, o: e.kind != "move", lambda e, o, r: _located(e, r)),
    "still": (lambda e, o: bool(o) and e.kind != "appear",
              lambda e, o, r: f"{_a(e.actor, r)} {_verb(e, r)[0]} while {_still(o, r)}"),
    "beside": (lambda e, o: bool(o) and e.kind == "appear",
               lambda e, o, r: f"{_a(e.actor, r)} {_verb(e, r)[0]} {relation(e.actor, o[0], r)} {_a(o[0], r)}"),
}


def describe_video(event: Event, others: tuple[SceneObject, ...], rng: np.random.Generator,
                   n: int = N_SENTENCES) -> tuple[list[str], list[str]]:
    """``n`` distinct sentences of the video and the names of their templates."""
    ordered = salience_order(others)
    pool = [name for name, (applies, _) in TEMPLATES.items() if applies(event, ordered)]
    chosen = [pool[int(i)] for i in rng.choice(len(pool), size=min(n, len(pool)), replace=False)]
    sentences: list[str] = []
    for name in chosen:
        for _ in range(20):  # re-draw synonyms until distinct; a few tries always suffice
            text = TEMPLATES[name][1](event, ordered, rng)
            if text not in sentences:
                break
        sentences.append(text)
    return sentences, chosen


# ---------------------------------------------------------------- dataset
def _check(cfg: dict[str, Any], dataset: str) -> tuple[int, int, int]:
    try:
        size, max_objects, frames = int(cfg["image_size"]), int(cfg["max_objects"]), int(cfg["frames"])
        counts = [int(cfg[f"n_{s}"]) for s in SPLITS]
    except KeyError as exc:
        raise CaprlError(f"synthetic video dataset {dataset}: the synthetic settings lack {exc.args[0]!r}") from None
    if size < 32 or not 1 <= max_objects <= 3 or frames < 2 or min(counts) < 0:
        raise CaprlError(f"synthetic video dataset {dataset}: need image_size >= 32, max_objects in 1..3, "
                         f"frames >= 2 and n_* >= 0; got {size}, {max_objects}, {frames}, {counts}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", dataset):
        raise CaprlError(f"dataset name {dataset!r} cannot name a GIF file (letters, digits, '_', '.', '-')")
    return size, max_objects, frames


def generate_videos(cfg: dict[str, Any], seed: int, dataset: str) -> Iterator[VideoSample]:
    """Yield the dataset's videos: train, then val, then test, each in index order."""
    size, max_objects, frames = _check(cfg, dataset)
    key = name_key(dataset)
    for split in SPLITS:
        code = SPLIT_CODES[split]
        for index in range(int(cfg[f"n_{split}"])):
            event, others, images, track = sample_video(
                np.random.default_rng([seed, key, code, index, 0]), max_objects, frames, size)
            sentences, templates = describe_video(event, others, np.random.default_rng([seed, key, code, index, 1]))
            name = f"{dataset}_{split}_{index:06d}.gif"
            yield VideoSample(name, f"{URL_ROOT}/{dataset}/{name}", split, index, sentences, templates, images,
                              event, others, track)


def save_gif(frames: list[Image.Image], path: Path) -> None:
    """An animated GIF keeping every frame (consecutive frames must differ; see the module doc)."""
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=FRAME_MS, loop=0,
                   optimize=False, disposal=1)


def write_video_dataset(cfg: dict[str, Any], seed: int, dataset: str, out_tsv: Path, gif_dir: Path
                        ) -> dict[str, Any]:
    """Write the GIFs (one atomic directory), then the split lists and the TSV (each atomically).

    Returns ``{"videos": n, "train": n, "val": n, "test": n, "sentences": n, "frames": n}``."""
    out_tsv, gif_dir = Path(out_tsv), Path(gif_dir)
    if out_tsv.resolve().is_relative_to(gif_dir.resolve()):
        raise CaprlError(f"the TSV {out_tsv} lies inside the GIF folder {gif_dir}, which is replaced as a whole")
    lists: dict[str, list[str]] = {split: [] for split in SPLITS}
    lines: list[str] = []
    frames = _check(cfg, dataset)[2]
    with atomic_directory(gif_dir) as tmp_dir:
        for sample in generate_videos(cfg, seed, dataset):
            save_gif(sample.frames, tmp_dir / sample.name)
            with Image.open(tmp_dir / sample.name) as gif:
                if gif.n_frames != frames:
                    raise CaprlError(f"{sample.name}: Pillow wrote {gif.n_frames} frames, not {frames}")
            lists[sample.split].append(sample.url)
            lines += [f"{sample.url}\t{sentence}" for sentence in sample.sentences]
    for split in SPLITS:
        io.write_text(out_tsv.parent / f"{split}.txt", "".join(f"{url}\n" for url in lists[split]))
    io.write_text(out_tsv, "".join(f"{line}\n" for line in lines))
    return {"videos": sum(len(urls) for urls in lists.values()), **{s: len(lists[s]) for s in SPLITS},
            "sentences": len(lines), "frames": frames}
