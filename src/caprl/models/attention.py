"""Additive (Bahdanau-style) spatial attention shared by the attention models."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from caprl.models import timeshared as ts
from caprl.models.base import Shared


class _AdditiveScores(torch.autograd.Function):
    """``scores [N, R] = tanh(keys [N, R, A] + query [N, 1, A]) @ w [A] (+ b)``.

    Autograd would keep the ``[N, R, A]`` tanh of every step of every decode for the backward
    (at COCO sizes, 36 x 512 floats per row and step: most of a training step's memory);
    this keeps only its inputs (``keys`` is the per-image projection, shared by all steps)
    and recomputes the tanh in the backward, in a workspace. The gradient of ``keys`` is
    summed over the steps in one buffer and handed to autograd once, by the last backward
    (the timeshared tape: see :mod:`caprl.models.timeshared`). ``data`` is the keys of every
    row, or (``keys`` a :class:`Shared`) of every image, their gradient summed per image.
    """

    @staticmethod
    def forward(ctx: Any, data: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, tape: ts.Tape | None, keys: Shared | None) -> torch.Tensor:
        query, weight = query.to(data.dtype), weight.to(data.dtype)
        e, grid = _tanh_sum(data if keys is None else keys, query)
        scores = e.matmul(weight)
        if grid is not None:
            scores = scores.index_select(0, grid)
        ctx.save_for_backward(data, query, weight)
        ctx.keys = keys
        if tape is not None:  # taped only if data is the first use's or a prefix of its rows
            if tape.pending == 0:
                tape.inputs = [data]
            first = tape.inputs[0]
            if not (data.data_ptr() == first.data_ptr() and data.shape[1:] == first.shape[1:]
                    and data.stride() == first.stride() and data.shape[0] <= first.shape[0]):
                tape = None
        ctx.tape = tape
        if tape is not None:
            tape.pending += 1
        return scores if bias is None else scores + bias.to(scores.dtype)

    @staticmethod
    def backward(ctx: Any, d_scores: torch.Tensor) -> tuple[Any, ...]:
        data, query, weight = ctx.saved_tensors
        keys = data if ctx.keys is None else ctx.keys
        e, grid = _tanh_sum(keys, query)
        d_scores = d_scores.to(data.dtype)
        if grid is not None:  # the grid's rows, zeros in its empty slots
            d_scores = d_scores.new_zeros(e.shape[:2]).index_copy(0, grid, d_scores)
        d_weight = torch.einsum("br,bra->a", d_scores, e) if ctx.needs_input_grad[2] else None
        d_bias = d_scores.sum().reshape(1) if ctx.needs_input_grad[3] else None
        d_pre = e.mul_(e).neg_().add_(1).mul_(d_scores.unsqueeze(-1)).mul_(weight)  # the workspace, in place
        d_query = d_pre.sum(1) if ctx.needs_input_grad[1] else None
        if d_query is not None and grid is not None:
            d_query = d_query.index_select(0, grid)
        d_data = None
        if ctx.needs_input_grad[0]:
            tape: ts.Tape | None = ctx.tape
            if tape is None:
                d_data = _per_image(keys, d_pre, grid is not None) if ctx.keys is not None else d_pre.clone()
            else:  # one buffer for the sum over steps (rows: the first use's), handed over by the last backward
                if ctx.keys is not None:
                    if not tape.grads:
                        tape.grads.append(_per_image(keys, d_pre, grid is not None))
                    else:
                        _per_image(keys, d_pre, grid is not None, into=tape.grads[0])
                else:
                    rows = d_pre.shape[0]
                    if not tape.grads:
                        tape.grads.append(d_pre.clone())
                    elif rows > tape.grads[0].shape[0]:
                        grown = d_pre.clone()
                        grown[: tape.grads[0].shape[0]] += tape.grads[0]
                        tape.grads[0] = grown
                    else:
                        tape.grads[0][:rows] += d_pre
                tape.pending -= 1
                if tape.pending == 0:
                    d_data = tape.grads[0]
                    tape.clear()
                    if d_data.shape != data.shape:  # cannot happen in a recurrence: the first use runs last
                        raise RuntimeError("attention keys: the last backward is not the first use's")
        return d_data, d_query, d_weight, d_bias, None, None


def _per_image(keys: Shared, d_rows: torch.Tensor, on_grid: bool, into: torch.Tensor | None = None) -> torch.Tensor:
    """The rows' gradient ``[N, ...]`` (``on_grid``: the whole grid's) summed per image ``[images, ...]``
    (added to ``into``)."""
    m, pos = keys.layout()
    images = keys.data.shape[0]
    if pos is None or on_grid:
        summed = d_rows.view(images, m, *d_rows.shape[1:]).sum(1)
        return summed if into is None else into.add_(summed)
    if into is None:
        into = d_rows.new_zeros(images, *d_rows.shape[1:])
    return into.index_add_(0, keys.rows, d_rows)


_WORKSPACE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
DENSE = 0.9  # rows filling at least this share of their grid are computed whole (below it a gather is cheaper)


def _tanh_sum(keys: "torch.Tensor | Shared", query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tanh(keys + query[:, None]), None)`` ``[N, R, A]`` in a workspace reused by every step:
    the temporary of each step would otherwise be a fresh allocation (at COCO sizes 18 MiB, 16
    times forward and backward per step), which the C allocator turns into fragmented,
    never-returned memory. Only read before the next call (it is never saved or returned).

    For :class:`Shared` keys whose rows fill most of their grid (XE's captions sorted by length,
    samples after a first shrink) it is ``(e, pos)``: ``e`` over the whole grid of ``m`` slots per
    image (a broadcast of each image's keys, no gather; empty slots read a zero query), the rows
    at ``pos``."""
    data = keys.data if isinstance(keys, Shared) else keys
    grid: torch.Tensor | None = None
    rows = keys.shape[0]
    if isinstance(keys, Shared):
        m, pos = keys.layout()
        if pos is not None and rows >= DENSE * data.shape[0] * m:
            grid, rows = pos, data.shape[0] * m
    numel = rows * data[0].numel() if data.shape[0] else 0
    key = (data.device, data.dtype)
    buffer = _WORKSPACE.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = _WORKSPACE[key] = torch.empty(numel, device=data.device, dtype=data.dtype)
    out = buffer[:numel].view(rows, *data.shape[1:])
    if grid is None:
        return _add_rows(keys, query, out).tanh_(), None
    wide = query.new_zeros(rows, query.shape[-1]).index_copy(0, grid, query)
    torch.add(data.unsqueeze(1), wide.view(data.shape[0], -1, 1, query.shape[-1]),
              out=out.view(data.shape[0], -1, *data.shape[1:]))
    return out.tanh_(), grid


def _add_rows(keys: "torch.Tensor | Shared", query: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``keys + query[:, None]`` over the rows (``keys``: per row, or :class:`Shared` per image)."""
    if not isinstance(keys, Shared):
        return keys + query.unsqueeze(1) if out is None else torch.add(keys, query.unsqueeze(1), out=out)
    m, pos = keys.layout()
    data = keys.data
    if pos is None:  # images in order, m rows each: a broadcast, no copy of the keys
        grid = (data.shape[0], m, *data.shape[1:])
        wide = query.view(data.shape[0], m, 1, query.shape[-1])
        if out is None:
            return (data.unsqueeze(1) + wide).view(keys.shape)
        torch.add(data.unsqueeze(1), wide, out=out.view(grid))
        return out
    if out is None:
        return data.index_select(0, keys.rows) + query.unsqueeze(1)
    return torch.index_select(data, 0, keys.rows, out=out).add_(query.unsqueeze(1))


def additive_scores(keys: "torch.Tensor | Shared", query: torch.Tensor, score: nn.Linear) -> torch.Tensor:
    """``score(tanh(keys + query[:, None]))`` squeezed to ``[N, R]`` (``score``: a Linear to 1),
    without keeping the ``[N, R, A]`` activation for the backward."""
    data = keys.data if isinstance(keys, Shared) else keys
    rows = keys.shape[0]
    if not ts.enabled() or rows * data[0].numel() < ts.MIN_TAPED:  # plain autograd (the reference; small sizes)
        return score(torch.tanh(_add_rows(keys, query))).squeeze(-1)
    taped = torch.is_grad_enabled() and data.requires_grad
    return _AdditiveScores.apply(data, query, score.weight[0], score.bias,
                                 ts.tape(score, "keys") if taped else None,
                                 keys if isinstance(keys, Shared) else None)


def attend(alpha: torch.Tensor, values: "torch.Tensor | Shared") -> torch.Tensor:
    """``sum_r alpha[n, r] values[n, r]`` ``[N, H]``. For :class:`Shared` values every image's
    rows are one product with its ``[R, H]`` values (on a grid of ``m`` rows per image, zeros
    where an image has fewer): each image's values are read once, not once per row, and their
    gradient is one ``[R, H]`` product per image and step instead of an outer product per row
    (SCST's 5 samples and XE's 5 captions of an image; benchmarks/README.md)."""
    if not isinstance(values, Shared):
        return torch.bmm(alpha.unsqueeze(1), values).squeeze(1)
    m, pos = values.layout()
    images, width = values.data.shape[0], values.data.shape[-1]
    if pos is None:
        return torch.bmm(alpha.view(images, m, -1), values.data).view(-1, width)
    grid = alpha.new_zeros(images * m, alpha.shape[1]).index_copy(0, pos, alpha)
    return torch.bmm(grid.view(images, m, -1), values.data).view(images * m, width).index_select(0, pos)


class AdditiveAttention(nn.Module):
    """alpha = softmax(w^T tanh(W_v V + W_h h)); returns (sum_n alpha_n V_n, alpha)."""

    def __init__(self, feat_size: int, query_size: int, hidden_size: int) -> None:
        super().__init__()
        self.proj_feats = nn.Linear(feat_size, hidden_size)
        self.proj_query = nn.Linear(query_size, hidden_size)
        self.score = nn.Linear(hidden_size, 1)

    def precompute(self, feats: torch.Tensor) -> torch.Tensor:
        """W_v V once per image, not once per step."""
        return self.proj_feats(feats)

    def forward(
        self, feats: "torch.Tensor | Shared", proj_feats: "torch.Tensor | Shared", query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = additive_scores(proj_feats, ts.linear(self.proj_query, query), self.score)
        alpha = torch.softmax(scores, dim=-1)
        return attend(alpha, feats), alpha
