"""Additive (Bahdanau-style) spatial attention shared by the attention models."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from caprl.models import timeshared as ts


class _AdditiveScores(torch.autograd.Function):
    """``scores [B, R] = tanh(keys [B, R, A] + query [B, 1, A]) @ w [A] (+ b)``.

    Autograd would keep the ``[B, R, A]`` tanh of every step of every decode for the backward
    (at COCO sizes, 36 x 512 floats per row and step: most of a training step's memory);
    this keeps only its inputs (``keys`` is the per-image projection, shared by all steps)
    and recomputes the tanh in the backward, in a workspace. The gradient of ``keys`` is
    summed over the steps in one buffer and handed to autograd once, by the last backward
    (the timeshared tape: see :mod:`caprl.models.timeshared`).
    """

    @staticmethod
    def forward(ctx: Any, keys: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, tape: ts.Tape | None) -> torch.Tensor:
        query, weight = query.to(keys.dtype), weight.to(keys.dtype)
        scores = _tanh_sum(keys, query).matmul(weight)
        ctx.save_for_backward(keys, query, weight)
        if tape is not None:  # taped only if keys is the first use's keys or a prefix of its rows
            if tape.pending == 0:
                tape.inputs = [keys]
            first = tape.inputs[0]
            if not (keys.data_ptr() == first.data_ptr() and keys.shape[1:] == first.shape[1:]
                    and keys.stride() == first.stride() and keys.shape[0] <= first.shape[0]):
                tape = None
        ctx.tape = tape
        if tape is not None:
            tape.pending += 1
        return scores if bias is None else scores + bias.to(scores.dtype)

    @staticmethod
    def backward(ctx: Any, d_scores: torch.Tensor) -> tuple[Any, ...]:
        keys, query, weight = ctx.saved_tensors
        e = _tanh_sum(keys, query)
        d_scores = d_scores.to(keys.dtype)
        d_weight = torch.einsum("br,bra->a", d_scores, e) if ctx.needs_input_grad[2] else None
        d_bias = d_scores.sum().reshape(1) if ctx.needs_input_grad[3] else None
        d_pre = e.mul_(e).neg_().add_(1).mul_(d_scores.unsqueeze(-1)).mul_(weight)  # the workspace, in place
        d_query = d_pre.sum(1) if ctx.needs_input_grad[1] else None
        d_keys = None
        if ctx.needs_input_grad[0]:
            tape: ts.Tape | None = ctx.tape
            if tape is None:
                d_keys = d_pre.clone()
            else:  # one buffer for the sum over steps (rows: the first use's), handed over by the last backward
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
                    d_keys = tape.grads[0]
                    tape.clear()
                    if d_keys.shape != keys.shape:  # cannot happen in a recurrence: the first use runs last
                        raise RuntimeError("attention keys: the last backward is not the first use's")
        return d_keys, d_query, d_weight, d_bias, None


_WORKSPACE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _tanh_sum(keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``tanh(keys + query[:, None])`` in a workspace reused by every step: the ``[B, R, A]``
    temporary of each step would otherwise be a fresh allocation (at COCO sizes 18 MiB, 16
    times forward and backward per step), which the C allocator turns into fragmented,
    never-returned memory. Only read before the next call (it is never saved or returned)."""
    key = (keys.device, keys.dtype)
    buffer = _WORKSPACE.get(key)
    if buffer is None or buffer.numel() < keys.numel():
        buffer = _WORKSPACE[key] = torch.empty(keys.numel(), device=keys.device, dtype=keys.dtype)
    out = buffer[: keys.numel()].view(keys.shape)
    return torch.add(keys, query.unsqueeze(1), out=out).tanh_()


def additive_scores(keys: torch.Tensor, query: torch.Tensor, score: nn.Linear) -> torch.Tensor:
    """``score(tanh(keys + query[:, None]))`` squeezed to ``[B, R]`` (``score``: a Linear to 1),
    without keeping the ``[B, R, A]`` activation for the backward."""
    if not ts.enabled() or keys.numel() < ts.MIN_TAPED:  # plain autograd (the reference; small sizes)
        return score(torch.tanh(keys + query.unsqueeze(1))).squeeze(-1)
    taped = torch.is_grad_enabled() and keys.requires_grad
    return _AdditiveScores.apply(keys, query, score.weight[0], score.bias, ts.tape(score, "keys") if taped else None)


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
        self, feats: torch.Tensor, proj_feats: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = additive_scores(proj_feats, ts.linear(self.proj_query, query), self.score)
        alpha = torch.softmax(scores, dim=-1)
        return torch.bmm(alpha.unsqueeze(1), feats).squeeze(1), alpha
