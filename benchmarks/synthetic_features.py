"""What the synthetic sets' pooled vector carries: linear probes of every backbone, side by side.

    python benchmarks/synthetic_features.py                 # images and videos, ~2 minutes on 2 cores
    python benchmarks/synthetic_features.py --json out.json

A Show-Tell model and the listener read only the pooled vector, so it must encode what the
captions say. For every backbone configuration below, the built-in generator's scenes
(``caprl.data.synthetic``; videos of ``caprl.data.synthetic_video``) go through the real
backbone (``caprl.features.backbones``; videos through ``caprl.features.video.pool_frames``), and a
linear classifier (softmax regression, full batch, the same for every row) is fitted on the
training scenes' pooled vectors and scored on held-out scenes:

* images, per cell of the 3 x 3 layout: is there an object (occupancy), and for the cells that
  hold one its shape (4 classes), colour (6) and size (2); the mean over the 9 cells;
* videos: the event (move, grow, shrink, colour, appear: 5 classes), and for moves the
  direction (4), for colour changes the new colour (6).

Chance is 1/classes (occupancy: the majority class). The reference row is ``patches`` (the
raw image as a 4x4 thumbnail, the synthetic backbone before ``tinycnn``), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from caprl.data.grammar import COLOURS, SHAPES, SIZES
from caprl.data.synthetic import generate
from caprl.data.synthetic_video import EVENT_KINDS, DIRECTIONS, generate_videos
from caprl.features.backbones import build_backbone
from caprl.features.video import pool_frames

FEATURES: dict[str, Any] = {
    "patches": {"backbone": "patches", "patches": {"grid": 4, "cell_size": 4, "extras": []}},
    "tinycnn": {"backbone": "tinycnn", "tinycnn": {"weights": "builtin", "grid": 3}},
}


def probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
          steps: int = 300) -> float:
    """Held-out accuracy of softmax regression (standardised inputs, L2 1e-3, L-BFGS)."""
    classes = sorted(set(y_train.tolist()) | set(y_test.tolist()))
    index = {c: i for i, c in enumerate(classes)}
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xt = torch.from_numpy((x_train - mean) / std).float()
    yt = torch.tensor([index[c] for c in y_train.tolist()])
    weight = torch.zeros(xt.shape[1], len(classes), requires_grad=True)
    bias = torch.zeros(len(classes), requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ weight + bias, yt) + 1e-3 * (weight ** 2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    xs = torch.from_numpy((x_test - mean) / std).float()
    with torch.no_grad():
        pred = (xs @ weight + bias).argmax(1).numpy()
    return float((pred == np.array([index[c] for c in y_test.tolist()])).mean())


def pooled_of(backbone: Any, images: list[Any]) -> np.ndarray:
    out = []
    for start in range(0, len(images), 100):
        batch = torch.stack([backbone.preprocess(im) for im in images[start:start + 100]])
        out.append(backbone(batch)[0].numpy())
    return np.concatenate(out)


def image_rows(n_train: int, n_test: int, seed: int) -> list[dict[str, Any]]:
    samples = list(generate({"n_train": n_train, "n_val": 0, "n_test": n_test, "image_size": 64, "max_objects": 3},
                            seed, "probe"))
    images = [s.image for s in samples]
    cells = [{o.row * 3 + o.col: o for o in s.scene.objects} for s in samples]
    train = np.arange(len(samples)) < n_train
    rows = []
    for name, features in FEATURES.items():
        started = time.perf_counter()
        x = pooled_of(build_backbone(features), images)
        seconds = time.perf_counter() - started
        accuracy: dict[str, list[float]] = {"occupancy": [], "shape": [], "colour": [], "size": []}
        for cell in range(9):
            held = np.array([cell in c for c in cells])
            accuracy["occupancy"].append(probe(x[train], held[train], x[~train], held[~train]))
            for attr in ("shape", "colour", "size"):
                labels = np.array([getattr(c[cell], attr) if cell in c else "" for c in cells])
                tr, te = train & held, ~train & held
                accuracy[attr].append(probe(x[tr], labels[tr], x[te], labels[te]))
        rows.append({"set": "images", "backbone": name, "dim": int(x.shape[1]),
                     "ms_per_image": 1000 * seconds / len(images),
                     **{k: float(np.mean(v)) for k, v in accuracy.items()}})
    return rows


def video_rows(n_train: int, n_test: int, seed: int) -> list[dict[str, Any]]:
    cfg = {"n_train": n_train, "n_val": 0, "n_test": n_test, "image_size": 64, "max_objects": 2, "frames": 8}
    videos = list(generate_videos(cfg, seed, "probe"))
    train = np.array([v.split == "train" for v in videos])
    kind = np.array([v.event.kind for v in videos])
    direction = np.array([v.event.direction or "" for v in videos])
    colour = np.array([v.event.colour_to or "" for v in videos])
    rows = []
    for name, features in FEATURES.items():
        backbone = build_backbone(features)
        for segments in (1, 2):
            pooled = []
            for v in videos:
                batch = torch.stack([backbone.preprocess(f) for f in v.frames])
                pooled.append(pool_frames(backbone, batch, len(v.frames), segments)[0].numpy())
            x = np.concatenate(pooled)
            moves, changes = kind == "move", kind == "colour"
            rows.append({"set": "videos", "backbone": f"{name}, segments {segments}", "dim": int(x.shape[1]),
                         "event": probe(x[train], kind[train], x[~train], kind[~train]),
                         "direction": probe(x[train & moves], direction[train & moves], x[~train & moves],
                                            direction[~train & moves]),
                         "new colour": probe(x[train & changes], colour[train & changes], x[~train & changes],
                                             colour[~train & changes])})
    return rows


def table(rows: list[dict[str, Any]], columns: list[str], chance: dict[str, float]) -> str:
    head = ["backbone", "dim", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| chance | | " + " | ".join(f"{chance[c]:.2f}" if c in chance else "" for c in columns) + " |")
    for row in rows:
        cells = [row["backbone"], str(row["dim"])] + [f"{row[c]:.3f}" if isinstance(row.get(c), float) else ""
                                                      for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1500, help="training scenes (+ a third held out)")
    parser.add_argument("--videos", type=int, default=600, help="training videos (+ a third held out)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    images = image_rows(args.images, args.images // 3, args.seed)
    print("Images: per-cell linear probes of the pooled vector (mean over the 9 cells, held-out accuracy)")
    print(table(images, ["occupancy", "shape", "colour", "size", "ms_per_image"],
                {"shape": 1 / len(SHAPES), "colour": 1 / len(COLOURS), "size": 1 / len(SIZES)}))
    videos = video_rows(args.videos, args.videos // 3, args.seed)
    print("\nVideos: linear probes of the pooled vector (held-out accuracy)")
    print(table(videos, ["event", "direction", "new colour"],
                {"event": 1 / len(EVENT_KINDS), "direction": 1 / len(DIRECTIONS), "new colour": 1 / len(COLOURS)}))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"images": images, "videos": videos}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
