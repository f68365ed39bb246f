"""The captioning-model interface every architecture implements.

A model is stepped one word at a time. Multi-stage models (Stack-Cap) run all their
stages in lock-step, each stage reading its own previous word, so one interface serves
teacher forcing, sampling, greedy decoding and beam search for every architecture:

* ``encode(pooled, regions) -> ctx``: per-image tensors (batch first), computed once.
* ``init_state(ctx) -> state``: a tuple of batch-first tensors.
* ``step(words, ctx, state) -> StepOutput``: ``words`` is ``[B, S]`` (one previous word
  per stage, 0 = start/end), ``logprobs`` is ``[B, S, V]``; ``attention`` is ``[B, S, R]``
  (zeros for stages without attention) or None for models with no attention at all;
  ``hidden`` is ``[B, S, H]``, the state the output layer reads (baselines and value
  networks are built on it).

``S = n_stages`` (1 for one-stage models). The last stage is the model's output: beam
search and evaluation use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from caprl.errors import CaprlError
from caprl.registry import Registry

Batch = Any  # nested tuple/dict of batch-first tensors


class StepOutput(NamedTuple):
    logprobs: torch.Tensor  # [B, S, V]
    state: tuple[torch.Tensor, ...]
    attention: torch.Tensor | None  # [B, S, R]
    hidden: torch.Tensor  # [B, S, H]: the hidden state each stage's word distribution is read from


def map_batch(fn: Callable[[torch.Tensor], torch.Tensor], obj: Batch) -> Batch:
    """Apply ``fn`` to every tensor of a nested tuple/list/dict (for expand and reorder)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_batch(fn, v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_batch(fn, v) for v in obj)
    return obj


@dataclass
class ModelConfig:
    """Sizes shared by the architectures; subclasses add their own fields."""

    embed_size: int = 512
    hidden_size: int = 512
    dropout: float = 0.5

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise CaprlError(
                f"{where}: key(s) {', '.join(unknown)} not used by this architecture; "
                f"it takes {', '.join(sorted(names))}"
            )
        return cls(**values)


class CaptionModel(nn.Module):
    """Base class: subclasses set ``n_stages`` and implement encode/init_state/step."""

    n_stages: int = 1
    config_class: type[ModelConfig] = ModelConfig

    def __init__(self, config: ModelConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.feat_dim = feat_dim
        self.n_regions = n_regions

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        raise NotImplementedError

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def step(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepOutput:
        raise NotImplementedError

    def teacher_forcing(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, S, T+1, V]`` of every stage given gold words ``labels [B, T]``.

        Position t predicts ``labels[:, t]``; position T predicts the end token.
        """
        batch, length = labels.shape
        state = self.init_state(ctx)
        prev = torch.zeros(batch, dtype=torch.long, device=labels.device)
        outputs = []
        for t in range(length + 1):
            out = self.step(prev.unsqueeze(1).expand(batch, self.n_stages), ctx, state)
            state = out.state
            outputs.append(out.logprobs)
            if t < length:
                prev = labels[:, t]
        return torch.stack(outputs, dim=2)


MODELS: Registry[type[CaptionModel]] = Registry("model architecture")


def register_model(name: str) -> Callable[[type[CaptionModel]], type[CaptionModel]]:
    return MODELS.register(name)


def build_model(
    arch: str, options: dict[str, Any], vocab_size: int, feat_dim: int, n_regions: int, where: str = "model"
) -> CaptionModel:
    """Instantiate a registered architecture from its params.yaml entry (minus ``arch``)."""
    cls = MODELS.get(arch, where=where)
    config = cls.config_class.from_dict(options, where)
    return cls(config, vocab_size=vocab_size, feat_dim=feat_dim, n_regions=n_regions)
