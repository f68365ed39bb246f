"""The built-in synthetic image dataset, written in the Karpathy format (``caprl synthesize``).

Scenes of 1..max_objects coloured shapes (circle, square, triangle, cross; 6 colours; small
or large) on a plain grey background, each object in one cell of a 3x3 layout grid, with 5
reference sentences from :mod:`caprl.data.grammar`. Shapes are large relative to the image
(a large object spans ~40% of its side); the ``tinycnn`` backbone (a CNN pre-trained on
single shapes, :mod:`caprl.features.tinycnn`) reads shape, colour, size and cell of every
object into the pooled vector (``python benchmarks/synthetic_features.py`` measures it).

Everything is a function of ``seed``, the dataset's name and its generator settings (the
``synthetic`` section with the dataset's own ``synthetic`` overrides): image ``i`` of split
``s`` draws from its own generator seeded with ``(seed, crc32(name), s, i)``, so two generated
datasets differ and changing ``n_train`` leaves the val/test images unchanged. Output, as
``caprl prepare`` reads it::

    <out-json> = {"dataset": <name>, "images": [{"filepath": "train", "filename":
                  "000000.png", "imgid": 0, "cocoid": 0, "split": "train", "sentids": [...],
                  "sentences": [{"tokens": [...], "raw": "...", "imgid": 0, "sentid": 0}]}]}
    <image-dir>/<split>/<imgid:06d>.png     (so image_root/filepath/filename resolves)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from caprl import io
from caprl.data import SPLITS
from caprl.data.grammar import COLOURS, SHAPES, SIZES, SceneObject, describe
from caprl.data.karpathy import tokenize

log = logging.getLogger(__name__)

SPLIT_CODES = {split: code for code, split in enumerate(SPLITS)}
BACKGROUND = (96, 96, 96)
COLOUR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 225),
    "yellow": (240, 220, 40),
    "purple": (150, 60, 190),
    "orange": (250, 140, 20),
}
CELL_CENTRES = (0.2, 0.5, 0.8)  # layout grid, as fractions of the image side
HALF_SIZE = {"small": 0.11, "large": 0.19}  # half the object's side, fraction of the image side
SUPERSAMPLE = 4  # draw at 4x and box-filter down: anti-aliased edges


@dataclass(frozen=True)
class Scene:
    """Objects (what captions say) plus their pixel geometry and colours (render jitter)."""

    objects: tuple[SceneObject, ...]
    centres: tuple[tuple[float, float], ...]  # fractions of the image side
    half_sizes: tuple[float, ...]  # fractions of the image side
    rgbs: tuple[tuple[int, int, int], ...]
    background: tuple[int, int, int]


class Sample(NamedTuple):
    entry: dict[str, Any]  # the Karpathy image record
    image: Image.Image
    scene: Scene


def _compatible(obj: SceneObject, others: list[SceneObject]) -> bool:
    for other in others:
        if (obj.col, obj.row) == (other.col, other.row):
            return False
        if (obj.shape, obj.colour) == (other.shape, other.colour):
            return False  # every object must be nameable unambiguously
        near = max(abs(obj.col - other.col), abs(obj.row - other.row)) < 2
        if near and obj.size == other.size == "large":
            return False  # two large neighbours would overlap
    return True


def sample_scene(rng: np.random.Generator, max_objects: int) -> Scene:
    n_objects = int(rng.integers(1, max_objects + 1))
    objects: list[SceneObject] = []
    while len(objects) < n_objects:
        candidate = SceneObject(
            shape=SHAPES[int(rng.integers(len(SHAPES)))],
            colour=COLOURS[int(rng.integers(len(COLOURS)))],
            size=SIZES[int(rng.integers(len(SIZES)))],
            col=int(rng.integers(3)),
            row=int(rng.integers(3)),
        )
        if _compatible(candidate, objects):
            objects.append(candidate)
    centres = tuple(
        (CELL_CENTRES[o.col] + rng.uniform(-0.02, 0.02), CELL_CENTRES[o.row] + rng.uniform(-0.02, 0.02))
        for o in objects
    )
    half_sizes = tuple(HALF_SIZE[o.size] * rng.uniform(0.92, 1.08) for o in objects)
    rgbs = tuple(
        tuple(int(c) for c in np.clip(np.array(COLOUR_RGB[o.colour]) + rng.integers(-12, 13, 3), 0, 255))
        for o in objects
    )
    shade = int(rng.integers(-8, 9))
    background = tuple(c + shade for c in BACKGROUND)
    return Scene(tuple(objects), centres, half_sizes, rgbs, background)  # type: ignore[arg-type]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, h: float, fill: tuple) -> None:
    if shape == "circle":
        draw.ellipse([x - h, y - h, x + h, y + h], fill=fill)
    elif shape == "square":
        draw.rectangle([x - h, y - h, x + h, y + h], fill=fill)
    elif shape == "triangle":
        draw.polygon([(x, y - h), (x + h, y + h), (x - h, y + h)], fill=fill)
    elif shape == "cross":
        t = 0.4 * h  # half the arm thickness
        draw.rectangle([x - h, y - t, x + h, y + t], fill=fill)
        draw.rectangle([x - t, y - h, x + t, y + h], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def render(scene: Scene, image_size: int) -> Image.Image:
    """RGB image of the scene; large objects first so small ones are never hidden."""
    side = image_size * SUPERSAMPLE
    canvas = Image.new("RGB", (side, side), scene.background)
    draw = ImageDraw.Draw(canvas)
    order = sorted(range(len(scene.objects)), key=lambda i: (scene.objects[i].size != "large", i))
    for i in order:
        (cx, cy), h = scene.centres[i], scene.half_sizes[i]
        _draw_shape(draw, scene.objects[i].shape, cx * side, cy * side, h * side, scene.rgbs[i])
    return canvas.resize((image_size, image_size), Image.Resampling.BOX)


def name_key(dataset: str) -> int:
    """A stable integer of the dataset's name (mixed into every random stream)."""
    return zlib.crc32(dataset.encode("utf-8"))


def generate(cfg: dict[str, Any], seed: int, dataset: str = "synthetic") -> Iterator[Sample]:
    """Yield the dataset's images in imgid order (train, then val, then test)."""
    imgid = 0
    key = name_key(dataset)
    for split in SPLITS:
        for index in range(int(cfg[f"n_{split}"])):
            code = SPLIT_CODES[split]
            scene = sample_scene(np.random.default_rng([seed, key, code, index, 0]), int(cfg["max_objects"]))
            raws = describe(scene.objects, np.random.default_rng([seed, key, code, index, 1]))
            sentids = [imgid * len(raws) + j for j in range(len(raws))]
            entry = {
                "filepath": split,
                "filename": f"{imgid:06d}.png",
                "imgid": imgid,
                "split": split,
                "sentids": sentids,
                "cocoid": imgid,
                "sentences": [
                    {"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sid}
                    for raw, sid in zip(raws, sentids)
                ],
            }
            yield Sample(entry, render(scene, int(cfg["image_size"])), scene)
            imgid += 1


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; move it onto ``path`` only on success.

    A killed job leaves the old directory or (between the two renames) none, plus hidden
    ``.name.*.tmp`` leftovers that the next successful run does not read.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a data directory should not be
    try:
        yield tmp
        if target.is_symlink() or target.is_file():
            target.unlink()
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old)  # replaces the empty directory just made
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_dataset(samples: Iterator[Sample], total: int, out_json: Path, image_dir: Path,
                  dataset: str = "synthetic") -> dict[str, Any]:
    """Write the images (as one atomic directory) and then the Karpathy JSON (atomically)."""
    entries = []
    with atomic_directory(image_dir) as tmp_dir:
        for split in SPLITS:
            (tmp_dir / split).mkdir()
        for sample in tqdm(samples, total=total, desc="synthesize", unit="img", disable=None):
            sample.image.save(tmp_dir / sample.entry["filepath"] / sample.entry["filename"], format="PNG")
            entries.append(sample.entry)
    data = {"dataset": dataset, "images": entries}
    io.write_json(out_json, data, indent=None)
    return data
