"""No-gradient decodes replayed from CUDA graphs (greedy captions: the self-critical baseline,
validation, evaluation; beam search: evaluation and the diversity sets).

A greedy caption of a Top-Down model at batch 50 is ~16 steps of ~25 small kernels each: on a
GPU its time is the host's launching them (18 ms on an H100), not the arithmetic (one graph
replay of the same decode: 3.5 ms, identical tokens; benchmarks/README.md). :func:`run` captures
a decode once per (model, what is decoded, input shapes, parameter storage) and replays it for
every later batch of those shapes: the inputs are copied into the graph's static tensors, the
graph replays, the outputs are cloned out (the next replay overwrites them).

Correct by construction where it can be, and eager where it cannot: only under ``torch.no_grad``,
only on CUDA, never inside another capture; new parameter storage (a model moved, or loaded with
``assign``) is a new key; parameters updated in place are read by the replay as they are now.
Joined weights cached by :mod:`caprl.models.timeshared` are made inside the graph (the cache is
invalidated before the capture and after it), so a replay never reads a join of old weights.
A capture is checked once: its first replay must give the eager warm-up's outputs (integers
exactly, floats to 1e-5). A capture that fails or differs is logged once and that decode runs
eagerly from then on.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import Any, Callable, TypeVar

import torch
from torch import nn

from caprl.models import timeshared
from caprl.models.base import batch_tensors, map_tensors

log = logging.getLogger(__name__)
T = TypeVar("T")

_enabled = True
MAX_GRAPHS = 8  # per model: batch shapes seen (the last, smaller batch of a split is a second one)
_FAILED = object()
_graphs: "weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], Any]]" = weakref.WeakKeyDictionary()


def set_enabled(on: bool) -> None:
    """Capture decodes on CUDA (params.yaml ``train.cuda_graphs``); off: every decode runs eagerly."""
    global _enabled
    _enabled = on


def _map(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """:func:`~caprl.models.base.map_tensors`, also into the fields of a dataclass (a decode's Samples)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(fn, getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    return map_tensors(fn, obj)


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor of ``obj``, also in the fields of a dataclass."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return list(batch_tensors(obj))


class _Graph:
    def __init__(self, graph: Any, inputs: list[torch.Tensor], outputs: Any) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


def on_side_stream(fn: Callable[[], T]) -> T:
    """``fn()`` on a side stream, ordered after and before the current one: how work is warmed up
    before a CUDA graph captures it (PyTorch's capture recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = fn()
    torch.cuda.current_stream().wait_stream(side)
    return result


def _capture(fn: Callable[[Any], T], inputs: Any) -> tuple[_Graph, T]:
    """Warm ``fn`` up on a side stream (its result is this call's), then capture it on static inputs."""
    static_in = _map(torch.clone, inputs)
    result = on_side_stream(lambda: fn(static_in))
    graph = torch.cuda.CUDAGraph()
    timeshared.weights_changed()  # joined weights are made inside the graph, at every replay
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = fn(static_in)
    finally:
        timeshared.weights_changed()  # what the capture cached was never computed: eager calls make it again
    graph.replay()  # the first replay must give what the eager warm-up gave, or the decode stays eager
    for got, want in zip(_tensors(outputs), _tensors(result), strict=True):
        if not (torch.equal(got, want) if not got.is_floating_point() else torch.allclose(got, want, 1e-5, 1e-5)):
            raise RuntimeError("the replay differs from the eager decode")
    return _Graph(graph, list(batch_tensors(static_in)), outputs), result


def run(model: nn.Module, what: tuple[Any, ...], fn: Callable[[Any], T], inputs: Any) -> T:
    """``fn(inputs)`` (a decode of ``model`` that reads only ``inputs`` and the model's parameters,
    with shapes fixed by the inputs' and no host read-back), replayed from a CUDA graph where it can
    be. ``what`` names the decode and its settings (e.g. ``("greedy", max_length)``)."""
    flat = list(batch_tensors(inputs))
    if (not _enabled or not flat or flat[0].device.type != "cuda" or torch.is_grad_enabled()
            or torch.cuda.is_current_stream_capturing()):
        return fn(inputs)
    key = (what, model.training, tuple((t.shape, t.dtype, t.device) for t in flat),
           tuple(p.data_ptr() for p in model.parameters()))
    graphs = _graphs.setdefault(model, {})
    entry = graphs.get(key)
    if entry is _FAILED:
        return fn(inputs)
    if entry is None:
        if len(graphs) >= MAX_GRAPHS:
            graphs.clear()
        try:
            graphs[key], result = _capture(fn, inputs)
        except Exception as exc:  # noqa: BLE001 - a decode that cannot be captured runs eagerly, said once
            log.warning("CUDA graph capture of the decode %s failed (%s: %s): decoding it eagerly",
                        what, type(exc).__name__, exc)
            graphs[key] = _FAILED
            return fn(inputs)
        return result
    for dst, src in zip(entry.inputs, flat):
        dst.copy_(src)
    entry.graph.replay()
    return _map(torch.clone, entry.outputs)
