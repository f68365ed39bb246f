"""Training methods (objectives), by name.

An objective turns a batch into a loss. It gets what it needs from an ``ObjectiveEnv``
(vocabulary, rewards by name, decoding settings) and knows nothing of the trainer, so a
new method is one class here plus one entry under ``objectives:`` in params.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np
import torch

from caprl import decoding
from caprl.decoding import Noise, Samples
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel


@dataclass
class Batch:
    """One training batch: ``image_ids [B]``, features, and gold captions.

    ``labels [M, T]`` holds every gold caption of the batch's images; ``label_image [M]``
    is the row (0..B-1) of the image each caption belongs to.
    """

    image_ids: list[int]
    pooled: torch.Tensor
    regions: torch.Tensor
    labels: torch.Tensor
    label_image: torch.Tensor
    noise: Noise | None = None  # sampling noise of this step (see caprl.decoding.Noise)

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.image_ids, self.pooled.to(device), self.regions.to(device), self.labels.to(device),
                     self.label_image.to(device), self.noise)


class RewardFn(Protocol):
    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray: ...


@dataclass
class ObjectiveEnv:
    """What an objective may use besides the model and the batch."""

    decode_words: Callable[[torch.Tensor], list[list[str]]]  # [N, T] token ids -> words
    reward: Callable[[str], RewardFn]  # reward by registry name, built once and cached
    max_length: int
    global_sum: Callable[[torch.Tensor], torch.Tensor] = lambda x: x  # sum over DDP processes
    world_size: int = 1
    extras: dict[str, Any] = field(default_factory=dict)


class Objective:
    """Subclasses implement ``loss``; ``options`` is the params.yaml entry of the objective."""

    #: objective options this method reads (besides lr, epochs); others are an error
    option_names: tuple[str, ...] = ()

    def __init__(self, options: dict[str, Any], env: ObjectiveEnv) -> None:
        unused = sorted(set(options) - set(self.option_names) - {"lr", "epochs"})
        if unused:
            raise CaprlError(
                f"objectives.{self.name}: key(s) {', '.join(unused)} not used by this objective; "
                f"it reads {', '.join(('lr', 'epochs') + self.option_names)}"
            )
        self.options = options
        self.env = env

    name: str = ""

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def greedy_and_samples(self, model: CaptionModel, batch: Batch, n: int) -> tuple[Samples, Samples]:
        """Self-critical decoding: the greedy captions (eval mode, no gradient) and ``n``
        samples per image (train mode, differentiable), from one encoding of the images."""
        ctx = model.encode(batch.pooled, batch.regions)
        model.eval()
        with torch.no_grad():
            greedy = decoding.sample(model, ctx, self.env.max_length, greedy=True)
        model.train()
        samples = decoding.sample(model, ctx, self.env.max_length, n=n,
                                  temperature=float(self.options.get("temperature", 1.0)), noise=batch.noise)
        return greedy, samples

    def mean(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked mean over the GLOBAL batch: with DDP (gradients averaged over processes)
        each process divides its sum by the global count, so the gradient is exactly the
        one-process gradient whatever the split."""
        count = self.env.global_sum(mask.sum().detach()).clamp(min=1.0)
        return (values * mask).sum() * self.env.world_size / count


O = TypeVar("O", bound=type[Objective])
OBJECTIVES: dict[str, type[Objective]] = {}


def register_objective(name: str) -> Callable[[O], O]:
    def decorator(cls: O) -> O:
        if name in OBJECTIVES:
            raise ValueError(f"objective '{name}' registered twice")
        cls.name = name
        OBJECTIVES[name] = cls
        return cls

    return decorator


def build_objective(name: str, options: dict[str, Any], env: ObjectiveEnv) -> Objective:
    if name not in OBJECTIVES:
        raise CaprlError(f"unknown objective '{name}'; registered: {', '.join(sorted(OBJECTIVES))}")
    return OBJECTIVES[name](options, env)
