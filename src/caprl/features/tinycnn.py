"""A tiny CNN pre-trained on single rendered shapes: the synthetic sets' stand-in for ImageNet features.

Real captioning features come from a CNN pre-trained on another labelled dataset (ResNet on
ImageNet) and then frozen. The built-in synthetic sets get the same arrangement at toy scale:
this network is trained once, on images that belong to no dataset (one shape of
:mod:`caprl.data.synthetic` anywhere in a 64-pixel image), to name the shape, colour and size
of that object,
and is then used frozen by the ``tinycnn`` backbone (:mod:`caprl.features.backbones`). Its
weights ship with the package (``weights/tinycnn.pt``, 60 KB), as pretrained ResNet weights are
downloaded; ``caprl pretrain-tinycnn`` remakes them (about a minute on one core) and records
with them the settings, the seed, the code version and the held-out accuracies.

Network: conv 5x5 (16) - ReLU - max-pool 2 - conv 3x3 (32) - ReLU - max-pool 2 - conv 3x3 (64)
- ReLU: a 64-channel map of 16 x 16 cells for a 64-pixel image, each unit seeing ~20 pixels
(a large shape's extent). During pre-training a global max-pool and one linear layer read the
map; the backbone reads the map itself. Each channel is divided by its mean max-pooled
activation over the pre-training images (``scale``), so features are of order one.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from caprl import io
from caprl.models import checkpoint
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

BUILTIN_WEIGHTS = Path(__file__).with_name("weights") / "tinycnn.pt"
IMAGE_SIZE = 64  # the network's input side; smaller images are upsampled (bilinear)
FORMAT = "caprl.tinycnn/1"


@dataclass(frozen=True)
class PretrainConfig:
    """How the shipped weights were made (``caprl pretrain-tinycnn`` flags)."""

    channels: tuple[int, int, int] = (16, 32, 64)
    images: int = 6000  # training images, drawn once
    steps: int = 800
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 0
    held_out: int = 1000  # images drawn after the training ones, for the accuracies


class TinyCNN(nn.Module):
    """Three conv layers; ``head`` names shape (4), colour (6) and size (2) from the max-pooled map."""

    def __init__(self, channels: tuple[int, int, int] = (16, 32, 64)) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.conv1 = nn.Conv2d(3, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        self.head = nn.Linear(c3, 4 + 6 + 2)
        self.register_buffer("scale", torch.ones(c3))

    @property
    def channels(self) -> int:
        return int(self.conv3.out_channels)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 3, 64, 64]`` RGB in [0, 1] -> ``[B, C, 16, 16]``, each channel divided by ``scale``."""
        x = 2.0 * x - 1.0
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.conv3(x)) / self.scale.view(1, -1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, 12]``: shape, colour, size (pre-training only)."""
        return self.head(self.feature_map(x).amax(dim=(2, 3)))


def to_input(image: Any, size: int = IMAGE_SIZE) -> torch.Tensor:
    """A PIL image -> ``[3, size, size]`` float32 in [0, 1] (bilinear resize when needed)."""
    from PIL import Image

    rgb = image.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


def single_shapes(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images of one shape each (anywhere, any colour and size, the renderer's jitter) and
    their labels ``[n, 3]`` (shape, colour, size indices)."""
    from caprl.data.grammar import COLOURS, SHAPES, SIZES, SceneObject
    from caprl.data.synthetic import BACKGROUND, COLOUR_RGB, HALF_SIZE, Scene, render

    images, labels = [], []
    for _ in range(n):
        shape, colour, size = (int(rng.integers(len(SHAPES))), int(rng.integers(len(COLOURS))),
                               int(rng.integers(len(SIZES))))
        obj = SceneObject(SHAPES[shape], COLOURS[colour], SIZES[size], 1, 1)
        half = HALF_SIZE[obj.size] * rng.uniform(0.85, 1.15)
        centre = tuple(float(c) for c in rng.uniform(half, 1.0 - half, 2))
        rgb = tuple(int(c) for c in np.clip(np.array(COLOUR_RGB[obj.colour]) + rng.integers(-12, 13, 3), 0, 255))
        background = tuple(c + int(rng.integers(-8, 9)) for c in BACKGROUND)
        scene = Scene((obj,), (centre,), (half,), (rgb,), background)  # type: ignore[arg-type]
        images.append(to_input(render(scene, IMAGE_SIZE)))
        labels.append((shape, colour, size))
    return torch.stack(images), torch.tensor(labels)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (F.cross_entropy(logits[:, :4], labels[:, 0]) + F.cross_entropy(logits[:, 4:10], labels[:, 1])
            + F.cross_entropy(logits[:, 10:], labels[:, 2]))


def accuracies(net: TinyCNN, images: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Held-out accuracy of each head."""
    with torch.no_grad():
        logits = net(images)
    out = {}
    for name, cols, k in (("shape", slice(0, 4), 0), ("colour", slice(4, 10), 1), ("size", slice(10, 12), 2)):
        out[name] = float((logits[:, cols].argmax(1) == labels[:, k]).float().mean())
    return out


def pretrain(config: PretrainConfig) -> tuple[TinyCNN, dict[str, float]]:
    """Train the network on single shapes (Adam, seeded), then set each channel's ``scale``."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng([config.seed, 0x7C])
    images, labels = single_shapes(rng, config.images)
    held_images, held_labels = single_shapes(rng, config.held_out)
    net = TinyCNN(config.channels)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed)
    for _ in range(config.steps):
        pick = torch.randint(0, len(images), (config.batch_size,), generator=gen)
        loss = _loss(net(images[pick]), labels[pick])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    net.eval()
    report = accuracies(net, held_images, held_labels)
    with torch.no_grad():  # the head, which reads the unscaled map, is not used after this
        net.scale.copy_(net.feature_map(images[:1000]).amax(dim=(2, 3)).mean(dim=0).clamp(min=1e-3))
    return net, report


def save(path: str | Path, net: TinyCNN, config: PretrainConfig, report: dict[str, float]) -> None:
    """The weights with what made them; loadable with ``torch.load(..., weights_only=True)``."""
    payload = {"format": FORMAT, "state": net.state_dict(), "config": {**asdict(config), "channels": list(config.channels)},
               "held_out_accuracy": report, "code_version": checkpoint.code_version()}
    with io.atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load(path: str | Path = BUILTIN_WEIGHTS) -> tuple[TinyCNN, dict[str, Any]]:
    """The frozen network (eval mode) and its record (config, accuracies, code version)."""
    path = Path(path)
    if not path.is_file():
        raise CaprlError(f"{path}: tiny CNN weights not found; make them with `caprl pretrain-tinycnn --out {path}` "
                         "or set features.tinycnn.weights: builtin")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: say which and what to do
        raise CaprlError(f"{path}: cannot read the tiny CNN weights ({exc}); remake them with "
                         f"`caprl pretrain-tinycnn --out {path}`") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CaprlError(f"{path}: not a tiny CNN weights file ({FORMAT}); remake it with caprl pretrain-tinycnn")
    net = TinyCNN(tuple(payload["config"]["channels"]))  # type: ignore[arg-type]
    net.load_state_dict(payload["state"])
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, {k: v for k, v in payload.items() if k != "state"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PretrainConfig()
    parser.add_argument("--out", default=str(BUILTIN_WEIGHTS), help="weights file to write (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--images", type=int, default=defaults.images)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # the same arithmetic on every machine's first core
    config = PretrainConfig(images=args.images, steps=args.steps, seed=args.seed)
    started = time.perf_counter()
    net, report = pretrain(config)
    save(args.out, net, config, report)
    log.info("tiny CNN pre-trained in %.0fs, held-out accuracy %s -> %s", time.perf_counter() - started,
             ", ".join(f"{k} {v:.3f}" for k, v in report.items()), args.out)
