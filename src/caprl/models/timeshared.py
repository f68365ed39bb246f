"""Layers applied at every step of a decode, with their weight gradients computed once.

A recurrent model applies the same weights at each of its ~17 steps. Autograd computes the
weight's gradient at every use and adds it to the others: per step, a ``[4H, D]`` product
whose inner size is only the batch (slow) and a full-size add. Here every use's backward
computes the gradient of its input as usual but only *records* its ``(dY, X)``; the use
whose backward runs last (no use of this weight is pending any more) computes the weight's
gradient of all uses as ONE product over every recorded row and returns it. Autograd, DDP's
hooks and the optimiser see one gradient per weight, the sum of the same terms.

Only layers inside a model's ``core`` go through here: every use there feeds the step's
hidden state, so every recorded use is reached by the backward of any loss built on the
decode. A use whose backward never runs would hold the gradient back: :func:`check` (run by
the trainer after each backward) turns that into an error instead of a silent zero, and
:func:`reset` (before each step) drops uses left by a graph that was never back-propagated.
Under ``torch.no_grad`` or for frozen weights these are the plain functional calls.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from caprl.errors import CaprlError

_ENABLED = True
_OPTIMISER_STEPS = 0  # bumped after any optimiser's step: fused optimisers update the weights
                      # in place without bumping their version counters, so the cache keys on both


def _count_optimiser_step(*_: Any) -> None:
    global _OPTIMISER_STEPS
    _OPTIMISER_STEPS += 1


register_optimizer_step_post_hook(_count_optimiser_step)


def weights_changed() -> None:
    """Every cached joined weight is made again at its next use: an optimiser step ran without its
    Python hooks (a replayed CUDA graph, :mod:`caprl.training.graphs`)."""
    _count_optimiser_step()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Plain autograd for every layer (the reference the tests compare against)."""
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before


def enabled() -> bool:
    """False inside :func:`disabled`: layers run as plain autograd (the memory-lean attention too)."""
    return _ENABLED


FLUSH_ROWS = 1024  # recorded rows folded into a weight's gradient at a time
MIN_TAPED = 1 << 18  # elements (1 MiB of float32): smaller layers gain less than a tape's Python costs


class Tape:
    """The recorded uses of one weight since its last gradient was delivered."""

    def __init__(self) -> None:
        self.parts: tuple[Any, ...] = ()
        self.fused = _Fused()
        self.clear()

    def clear(self) -> None:
        self.pending = 0
        self.grads, self.inputs = [], []
        self.rows = 0
        self.total: torch.Tensor | None = None
        self.bias_grad: torch.Tensor | None = None

    def record(self, grad: torch.Tensor, inputs: torch.Tensor, accumulate: Any,
               shape: tuple[int, ...] | None = None) -> None:
        """Keep one use's rows; every :data:`FLUSH_ROWS` rows, fold them into the running total
        with one product (large enough to run near the machine's peak, small enough that the
        joined rows stay cheap to copy)."""
        self.grads.append(grad)
        self.inputs.append(inputs)
        self.rows += grad.shape[0]
        if self.rows >= FLUSH_ROWS:
            self.flush(accumulate, shape)

    def flush(self, accumulate: Any, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Fold the kept rows into the total and return it: ``accumulate(grads, inputs, total)``."""
        if self.grads:
            grads = self.grads[0] if len(self.grads) == 1 else torch.cat(self.grads)
            inputs = self.inputs[0] if len(self.inputs) == 1 else torch.cat(self.inputs)
            if self.total is None:
                rows = shape or (grads.shape[1], inputs.shape[1])
                wide = torch.promote_types(grads.dtype, torch.float32)  # bf16 rows summed in float32
                self.total = grads.new_zeros(rows, dtype=wide)
                self.bias_grad = grads.new_zeros(grads.shape[1], dtype=wide)
            accumulate(grads, inputs, self.total)
            assert self.bias_grad is not None
            if shape is None:
                self.bias_grad += grads.sum(0, dtype=self.bias_grad.dtype)
            self.grads, self.inputs, self.rows = [], [], 0
        assert self.total is not None
        return self.total


def tape(module: nn.Module, name: str) -> Tape:
    """The tape of ``module``'s ``name`` (made on first use)."""
    tapes = module.__dict__.setdefault("_caprl_tapes", {})
    if name not in tapes:
        tapes[name] = Tape()
    return tapes[name]


Part = tuple[nn.Module, str, "slice | None"]  # (module, weight name, its columns; None: all)


def _join(weights: Sequence[torch.Tensor], parts: tuple[Part, ...]) -> torch.Tensor:
    """``[W_1[:, cols_1] | W_2[:, cols_2] | ...]``; a single whole weight is itself (no copy)."""
    if len(parts) == 1 and parts[0][2] is None:
        return weights[0]
    return torch.cat([w if cols is None else w[:, cols] for w, (_, _, cols) in zip(weights, parts)], dim=1)


class _Fused:
    """The weight ``[W_1[:, cols_1] | W_2[:, cols_2] | ...]`` and the summed biases, made again
    whenever a parameter may have changed: new storage, an in-place write (its version
    counter), or any optimiser step since (fused optimisers leave the counter alone)."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] = ()
        self.weight = self.bias = torch.empty(0)

    def get(self, parts: tuple[Part, ...], biases: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        weights = [getattr(m, name) for m, name, _ in parts]
        key = (_OPTIMISER_STEPS, parts, *((t.data_ptr(), t._version, t.dtype) for t in (*weights, *biases)))
        if key != self.key:
            with torch.no_grad():
                self.weight = _join(weights, parts)
                self.bias = biases[0] if len(biases) == 1 else torch.stack(biases).sum(0) if biases else None
            self.key = key
        return self.weight, self.bias


def _add_product(grads: torch.Tensor, inputs: torch.Tensor, total: torch.Tensor) -> None:
    total.addmm_(grads.t().to(total.dtype), inputs.to(total.dtype))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tape: Tape, parts: tuple[Part, ...], n_weights: int,
                *params: torch.Tensor) -> torch.Tensor:
        if tape.pending == 0:
            tape.parts = parts
        elif tape.parts != parts:  # the recorded rows of all uses must have one layout
            raise RuntimeError(f"timeshared tape used with two layouts: {tape.parts} and {parts}")
        weight, bias = tape.fused.get(parts, params[n_weights:])
        ctx.save_for_backward(x)
        ctx.tape, ctx.parts, ctx.params, ctx.n_weights = tape, parts, params, n_weights
        ctx.weight = weight
        tape.pending += 1
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors  # under autocast dy may be bfloat16: products in dy's dtype
        tape: Tape = ctx.tape
        dy2 = dy.reshape(-1, dy.shape[-1])  # any leading dimensions, as F.linear
        dx = dy2.mm(ctx.weight.to(dy.dtype)).to(x.dtype).view(x.shape) if ctx.needs_input_grad[0] else None
        tape.record(dy2, x.reshape(-1, x.shape[-1]).to(dy.dtype), _add_product)
        tape.pending -= 1
        none = (None,) * (3 + len(ctx.params))
        if tape.pending > 0:
            return (dx, *none)
        dw = tape.flush(_add_product)  # [out, sum of the parts' columns]
        db = tape.bias_grad
        tape.clear()
        grads: list[torch.Tensor | None] = []
        col = 0
        for (module, name, cols), param in zip(ctx.parts, ctx.params):
            width = param.shape[1] if cols is None else len(range(*cols.indices(param.shape[1])))
            piece = dw[:, col : col + width].to(param.dtype)
            col += width
            if cols is None:
                grads.append(piece)
            else:
                full = torch.zeros_like(param)
                full[:, cols] = piece
                grads.append(full)
        grads += [db.to(b.dtype) for b in ctx.params[ctx.n_weights:]]
        return (dx, None, None, None, *grads)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, words: torch.Tensor, weight: torch.Tensor, tape: Tape) -> torch.Tensor:
        ctx.tape, ctx.rows = tape, weight.shape[0]
        ctx.save_for_backward(words)
        tape.pending += 1
        return F.embedding(words, weight)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        (words,) = ctx.saved_tensors
        tape: Tape = ctx.tape
        add = lambda g, i, acc: acc.index_add_(0, i, g.to(acc.dtype))  # noqa: E731
        tape.record(dy.reshape(-1, dy.shape[-1]), words.reshape(-1), add, shape=(ctx.rows, dy.shape[-1]))
        tape.pending -= 1
        if tape.pending > 0:
            return None, None, None
        dw = tape.flush(add, shape=(ctx.rows, dy.shape[-1]))
        tape.clear()
        return None, dw, None


def taped(*tensors: torch.Tensor) -> bool:
    """Whether uses of these trainable tensors go through a tape: gradients on, all of them
    trainable, and large enough (:data:`MIN_TAPED` elements) for one product per backward
    to beat autograd's per-use ones; small layers keep torch's own kernels."""
    return (_ENABLED and torch.is_grad_enabled() and all(t.requires_grad for t in tensors)
            and sum(t.numel() for t in tensors) >= MIN_TAPED)


def fused_linear(x: torch.Tensor, parts: tuple[Part, ...], biases: tuple[tuple[nn.Module, str], ...] = (),
                 key: tuple[nn.Module, str] | None = None) -> torch.Tensor:
    """One product for several linear maps whose inputs are concatenated in ``x``:
    ``x @ [W_1[:, cols_1] | W_2[:, cols_2] | ...]^T + sum of the biases``. The joined weight
    is cached until the parameters change; with gradients, the weights' gradients are taped
    (under ``key``, default the first part's module and weight name)."""
    weights = tuple(getattr(m, name) for m, name, _ in parts)
    bias_tensors = tuple(getattr(m, name) for m, name in biases)
    module, name = key or (parts[0][0], parts[0][1])
    recorded = tape(module, name)
    if taped(*weights, *bias_tensors):
        return _Linear.apply(x, recorded, parts, len(weights), *weights, *bias_tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (*weights, *bias_tensors)):  # plain autograd
        return F.linear(x, _join(weights, parts), sum(bias_tensors) if bias_tensors else None)
    weight, bias = recorded.fused.get(parts, bias_tensors)  # no gradient to the weights: the cached joined weight
    return F.linear(x, weight, bias)


def linear(module: nn.Module, x: torch.Tensor, weight: str = "weight", bias: str | None = "bias") -> torch.Tensor:
    """``F.linear(x, module.<weight>, module.<bias>)``, its weight gradient taped."""
    return fused_linear(x, ((module, weight, None),), ((module, bias),) if bias is not None else ())


def embedding(module: nn.Embedding, words: torch.Tensor) -> torch.Tensor:
    """The embedding of ``words``: token ids ``[...]`` -> ``module(words)``, its weight gradient
    taped (no padding index, no max_norm); or rows over the vocabulary ``[..., V]`` (float:
    one-hot, straight-through one-hot or a relaxed distribution) -> ``rows @ weight``,
    differentiable w.r.t. both (the relaxed speaker input of paper 004's PSST; the authors'
    models/AttModel.py:395-399 feed ``soft_vec @ embed.weight``).

    Rows go through plain autograd, never through the tape: a loss that mixes both (the start
    token's ids, then rows) gets the tape's gradient from its id uses and autograd's from the
    row products, summed by autograd, and :func:`check`/:func:`reset` see only the taped uses.
    """
    if words.is_floating_point():
        if words.shape[-1] != module.weight.shape[0]:
            raise CaprlError(f"embedding: rows of {words.shape[-1]} entries, vocabulary of {module.weight.shape[0]}")
        return torch.matmul(words.to(module.weight.dtype), module.weight)
    if not taped(module.weight) or module.padding_idx is not None or module.max_norm is not None:
        return module(words)
    return _Embedding.apply(words, module.weight, tape(module, "weight"))


def lstm_cell(cell: nn.LSTMCell, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
              gates: torch.Tensor | None = None, columns: tuple[slice, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``cell`` (torch's gate order i, f, g, o) as ONE product of ``[x, h]`` with
    ``[W_ih | W_hh]``, weights taped. ``columns``: the columns of ``W_ih`` that ``x`` feeds (the
    rest of the input's projection is in ``gates``, added to the pre-activations: a part of
    the input that is the same at every step, projected once per image)."""
    h, c = state
    if type(cell) is not nn.LSTMCell:  # a replaced cell (a wrapper, another recurrence): its own forward
        if gates is not None or columns:
            raise TypeError(f"{type(cell).__name__}: a split input needs a torch nn.LSTMCell")
        return cell(x, state)
    if gates is None and not columns and sum(p.numel() for p in cell.parameters()) < MIN_TAPED:
        return cell(x, state)  # a small cell: torch's own kernel is faster than one product and the gates here
    ih = tuple((cell, "weight_ih", cols) for cols in columns) if columns else ((cell, "weight_ih", None),)
    pre = fused_linear(torch.cat([x, h], dim=1), (*ih, (cell, "weight_hh", None)),
                       ((cell, "bias_ih"), (cell, "bias_hh")))
    if gates is not None:
        pre = pre + gates
    i, f, g, o = pre.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _tapes(root: nn.Module) -> Iterator[tuple[str, Tape]]:
    for name, module in root.named_modules():
        for weight, tape in module.__dict__.get("_caprl_tapes", {}).items():
            yield f"{name}.{weight}" if name else weight, tape


def reset(root: nn.Module) -> None:
    """Forget uses whose graph was dropped without a backward (call before a training step)."""
    for _, tape in _tapes(root):
        tape.clear()


def check(root: nn.Module) -> None:
    """After a backward: every taped use must have been reached, or a gradient is missing."""
    stuck = [name for name, tape in _tapes(root) if tape.pending]
    if stuck:
        raise CaprlError(
            f"the gradients of {', '.join(stuck)} were not delivered: a decode step ran with gradients "
            "enabled but its outputs do not reach the loss. Run decodes whose results are not trained "
            "on under torch.no_grad()")
