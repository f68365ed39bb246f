"""The captioning-model interface every architecture implements.

A model is stepped one word at a time. Multi-stage models (Stack-Cap) run all their
stages in lock-step, each stage reading its own previous word, so one interface serves
teacher forcing, sampling, greedy decoding and beam search for every architecture:

* ``encode(pooled, regions) -> ctx``: per-image tensors (batch first), computed once.
* ``init_state(ctx) -> state``: a tuple of batch-first tensors.
* ``core(words, ctx, state) -> StepCore``: the recurrent part of a step. ``words`` is
  ``[B, S]`` (one previous word per stage, 0 = start/end) or rows over the vocabulary
  ``[B, S, V]`` (float: one-hot, straight-through or relaxed; every architecture embeds its
  words with :func:`caprl.models.timeshared.embedding`, ``rows @ W`` for rows, so a relaxed
  word is read as in the authors' PSST code); ``out [B, S, F]`` is what the
  output layer reads; ``attention`` is ``[B, S, R]`` (zeros for stages without attention)
  or None for models with no attention at all; ``hidden`` is ``[B, S, H]``, the hidden
  state (baselines and value networks are built on it).
* ``head(out) -> logits [..., S, V]``: the output layer (dropout included). It has no
  recurrence, so teacher forcing runs it once over every position of the batch
  (:meth:`CaptionModel.token_logprobs`) instead of once per step. One-stage models tape
  its weight (:mod:`caprl.models.timeshared`): every loss on a decode reads their only
  stage; multi-stage models do not, since a loss may read the last stage alone.
* ``step(words, ctx, state) -> StepOutput`` = core, head and log-softmax: ``logprobs [B, S, V]``.

``S = n_stages`` (1 for one-stage models). The last stage is the model's output: beam
search and evaluation use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from caprl.errors import CaprlError
from caprl.registry import Registry

Batch = Any  # nested tuple/dict of batch-first tensors


class StepCore(NamedTuple):
    out: torch.Tensor  # [B, S, F]: what the output layer reads
    state: tuple[torch.Tensor, ...]
    attention: torch.Tensor | None  # [B, S, R]
    hidden: torch.Tensor  # [B, S, H]


class StepOutput(NamedTuple):
    logprobs: torch.Tensor  # [B, S, V]
    state: tuple[torch.Tensor, ...]
    attention: torch.Tensor | None  # [B, S, R]
    hidden: torch.Tensor  # [B, S, H]: the hidden state each stage's word distribution is read from


class Shared:
    """A context tensor stored once per image ``data [images, ...]`` and read by decode rows
    through ``rows [N]`` (each row's image). Row operations (:func:`map_batch`: expanding to
    ``n`` captions per image, dropping ended rows, sorting by length) move ``rows`` and leave
    ``data`` alone, so an image's regions are stored, read and (their gradient) summed once
    however many rows decode it (:func:`caprl.models.attention.attend`). Made by :func:`shared`
    on a CPU only: on a GPU the rows' layout would need a host read, and copies are cheap there."""

    __slots__ = ("data", "rows", "_layout")

    def __init__(self, data: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        self.data = data
        self.rows = torch.arange(data.shape[0], device=data.device) if rows is None else rows
        self._layout: tuple[int, torch.Tensor | None] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the per-row tensor this stands for."""
        return (self.rows.shape[0], *self.data.shape[1:])

    def layout(self) -> tuple[int, torch.Tensor | None]:
        """``(m, pos)``: the rows laid out on a grid of ``m`` slots per image, ``pos [N]`` each
        row's place in it (``image * m + slot``); ``pos`` None when the rows are the images in
        order, ``m`` each (the grid is the rows themselves). Computed once per row map."""
        if self._layout is None:
            images, n = self.data.shape[0], self.rows.shape[0]
            m = n // images if images else 0
            if m * images == n and torch.equal(self.rows, torch.arange(images, device=self.rows.device)
                                               .repeat_interleave(m)):
                self._layout = (m, None)
            else:
                counts = torch.bincount(self.rows, minlength=images)
                order = torch.argsort(self.rows, stable=True)
                starts = counts.cumsum(0) - counts
                slot = torch.empty_like(self.rows)
                slot[order] = torch.arange(n, device=self.rows.device) - starts.index_select(0, self.rows[order])
                m = int(counts.max())
                self._layout = (m, self.rows * m + slot)
        return self._layout


SHARE_ON_CPU = True  # tests switch it off to compare with per-row copies (what a GPU decodes)


def shared(data: torch.Tensor) -> "torch.Tensor | Shared":
    """``data [images, ...]`` as a :class:`Shared` context entry on a CPU; itself elsewhere."""
    return Shared(data) if SHARE_ON_CPU and data.device.type == "cpu" else data


def batch_tensors(obj: Batch) -> Iterator[torch.Tensor]:
    """Every tensor of a nested tuple/list/dict, in order (a :class:`Shared`: its rows, then its data)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Shared):
        yield obj.rows
        yield obj.data
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from batch_tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from batch_tensors(v)


def map_batch(fn: Callable[[torch.Tensor], torch.Tensor], obj: Batch) -> Batch:
    """A row operation ``fn`` (expand, reorder, select, slice) on every tensor of a nested
    tuple/list/dict; a :class:`Shared` entry's row map is moved, its per-image data kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Shared):
        return Shared(obj.data, fn(obj.rows))
    if isinstance(obj, dict):
        return {k: map_batch(fn, v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_batch(fn, v) for v in obj)
    return obj


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Batch) -> Batch:
    """``fn`` on every tensor, a :class:`Shared` entry's data included (clones, copies, moves)."""
    if isinstance(obj, Shared):
        return Shared(fn(obj.data), fn(obj.rows))
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    return fn(obj) if isinstance(obj, torch.Tensor) else obj


_STEPPED: tuple[int, torch.Tensor] | None = None  # inside stepped_rows: (rows of the batch, the stepped rows)


@contextlib.contextmanager
def stepped_rows(rows: int, index: torch.Tensor | None) -> Iterator[None]:
    """A decode step of the rows ``index`` of a ``rows``-row batch (None: every row). Inside it,
    :class:`RowDropout` applies to the stepped rows their rows of a whole batch's mask."""
    global _STEPPED
    before, _STEPPED = _STEPPED, None if index is None else (rows, index)
    try:
        yield
    finally:
        _STEPPED = before


class RowDropout(nn.Dropout):
    """``nn.Dropout`` whose masks do not depend on which rows a decode steps. Inside
    :func:`stepped_rows` it draws the whole batch's mask as torch's dropout draws it for that
    batch (one Bernoulli draw of its shape, divided by 1 - p) and multiplies the stepped rows by
    their rows of it: a decode that drops its ended rows (:mod:`caprl.decoding.live_rows`) then samples
    and trains on the same numbers as one that steps every row. Elsewhere it is ``nn.Dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _STEPPED is None or not self.training or self.p in (0.0, 1.0):
            return super().forward(x)
        rows, index = _STEPPED
        if x.shape[0] != index.shape[0]:
            raise CaprlError(f"dropout on {x.shape[0]} rows inside a decode step of {index.shape[0]} rows")
        noise = x.new_empty((rows, *x.shape[1:])).bernoulli_(1 - self.p).div_(1 - self.p)
        return x * noise.index_select(0, index)


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
    #: False for models whose ``encode`` reads only the pooled vector: their batches skip the regions
    reads_regions: bool = True

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

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        raise NotImplementedError

    def head(self, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepOutput:
        core = self.core(words, ctx, state)
        return StepOutput(torch.log_softmax(self.head(core.out), dim=-1), core.state, core.attention, core.hidden)

    def token_logprobs(self, ctx: Batch, labels: torch.Tensor, sample_prob: float = 0.0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """``[B, S, T+1]``: every stage's log-probability of each gold word of ``labels [B, T]``
        (position T: the end token), 0 after a caption's end token. What XE needs, computed
        without waste: captions are sorted by length and the batch shrinks as they end (no
        step is run for padding), and the output layer runs once over all positions.
        Equal to gathering :meth:`teacher_forcing` (same dropout distribution, other draws).

        ``sample_prob`` > 0: scheduled sampling (Bengio et al. 2015, as self-critical.pytorch
        trains XE): every input after the start token is, per row and with that probability, a
        word sampled (``generator``) from the last stage's distribution of the step before
        instead of the gold word; the targets stay gold. The output layer then runs per step.
        """
        batch, length = labels.shape
        steps = (labels > 0).sum(dim=1) + 1  # words + the end token
        order = torch.argsort(steps, descending=True, stable=True)
        active = torch.bincount(steps.clamp(max=length + 1), minlength=length + 2).flip(0).cumsum(0).flip(0)
        active = active[1:].tolist()  # active[t] = rows still running at position t (one sync, before the loop)
        gold = torch.cat([labels, labels.new_zeros(batch, 1)], dim=1).index_select(0, order)  # [B, T+1]
        ctx = map_batch(lambda t: t.index_select(0, order), ctx)
        state = self.init_state(ctx)
        prev = torch.zeros(batch, self.n_stages, dtype=torch.long, device=labels.device)
        outs, targets = [], []
        for t in range(length + 1):
            n = active[t]
            if n == 0:
                break
            if n < prev.shape[0]:  # the shortest captions have ended: drop their rows (views, no copy)
                ctx = map_batch(lambda x: x[:n], ctx)
                state = map_batch(lambda x: x[:n], state)
                prev = prev[:n]
            core = self.core(prev, ctx, state)
            state = core.state
            targets.append(gold[:n, t])
            word = gold[:n, t]
            if sample_prob > 0:
                outs.append(self.head(core.out))  # [n, S, V]: the step's logits, sampled from below
                word = self._scheduled(outs[-1][:, -1], word, sample_prob, generator)
            else:
                outs.append(core.out)
            prev = word[:, None].expand(n, self.n_stages)
        packed = torch.cat(outs)  # [P, S, F] (or [P, S, V] when sampling), position-major
        logits = packed if sample_prob > 0 else self.head(packed)  # [P, S, V]
        target = torch.cat(targets).unsqueeze(1).expand(-1, logits.shape[1])  # [P, S]
        picked = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                  reduction="none").view(target.shape)  # rows contiguous: the fast kernel
        # back to [B, S, T+1] in the caller's row order
        rows = torch.cat([order[:n] for n in active[: len(outs)]])
        cols = torch.cat([torch.full((n,), t, device=labels.device) for t, n in enumerate(active[: len(outs)])])
        out = picked.new_zeros(batch, length + 1, logits.shape[1])
        out = out.index_put((rows, cols), picked)
        return out.transpose(1, 2)

    def token_logprobs_fixed(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """:meth:`token_logprobs` (no scheduled sampling) with shapes that depend only on
        ``labels.shape``: every row runs all T+1 steps (padding included, masked to 0 after its
        end token) and nothing reads the device back, so a CUDA graph can capture it
        (:mod:`caprl.training.graphs`). Same log-probabilities; more arithmetic, fewer launches."""
        batch, length = labels.shape
        gold = torch.cat([labels, labels.new_zeros(batch, 1)], dim=1)  # [B, T+1]
        state = self.init_state(ctx)
        prev = torch.zeros(batch, self.n_stages, dtype=torch.long, device=labels.device)
        outs = []
        for t in range(length + 1):
            core = self.core(prev, ctx, state)
            state = core.state
            outs.append(core.out)
            prev = gold[:, t : t + 1].expand(batch, self.n_stages)
        logits = self.head(torch.stack(outs, dim=1))  # [B, T+1, S, V]
        target = gold.unsqueeze(-1).expand(-1, -1, logits.shape[2])  # [B, T+1, S]
        picked = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                  reduction="none").view(target.shape)
        lengths = (labels > 0).sum(dim=1, keepdim=True)  # the end token's position
        live = torch.arange(length + 1, device=labels.device).unsqueeze(0) <= lengths  # [B, T+1]
        return (picked * live.unsqueeze(-1)).transpose(1, 2)

    @staticmethod
    def _scheduled(logits: torch.Tensor, gold: torch.Tensor, sample_prob: float,
                   generator: torch.Generator | None) -> torch.Tensor:
        """The next input of each row: gold, or with ``sample_prob`` a word sampled from ``logits``."""
        probs = torch.softmax(logits.detach().float(), dim=-1)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        use = torch.rand(gold.shape[0], generator=generator, device=gold.device) < sample_prob
        return torch.where(use, sampled, gold)

    def teacher_forcing(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, S, T+1, V]`` of every stage given gold words ``labels [B, T]``.

        Position t predicts ``labels[:, t]``; position T predicts the end token. (XE needs
        only the gold words' entries: :meth:`token_logprobs` computes those much faster.)
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
