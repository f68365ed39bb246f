"""A whole training step as one CUDA graph, for objectives whose loss has fixed shapes (XE).

On a GPU a caption model's step is bound by kernel launches, not arithmetic: ~1,800 small
kernels for an XE Top-Down step at batch 50 (benchmarks/README.md), each paid for by the
host. A CUDA graph records the step's kernels once (forward, backward, clipping, Adam) and
replays them with one launch, as PyTorch's "whole-network capture" recipe does
(https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs): the batch is copied into
static input tensors, the graph replays, the loss is read from its static output.

What it needs, and what it does where that is missing:
* the objective's :meth:`~caprl.objectives.Objective.fixed_loss` (no host read-back, shapes set
  by the batch's), for the batches its ``fixed_step`` accepts (XE: not under scheduled sampling);
  the trainer steps the others, and every step of other methods, eagerly;
* every batch of the shapes it was captured with (the last, smaller batch of an epoch, or a
  batch with another number of captions, runs :attr:`GraphedStep.run`'s eager twin);
* the optimiser ``capturable`` and each group's rate a device tensor (:func:`capturable_adam`),
  so the rate schedule writes into the tensor the graph reads (:func:`set_lr`).

The first ``warmup`` steps run the same fixed-shape step eagerly on a side stream (as the recipe
requires before a capture); they are real steps, not thrown away. Dropout draws from the
default CUDA generator, whose state the graph advances as eager calls would, so a resumed run
(which restores that state) continues the same stream. Layers run as plain autograd here (the
weight-gradient tapes of :mod:`caprl.models.timeshared` keep host-side state between steps).
On a CPU nothing is captured: the step runs eagerly (``capture=False``, what the CPU tests use).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from caprl.decoding.captured import on_side_stream
from caprl.data.batch import Batch
from caprl.models import timeshared

log = logging.getLogger(__name__)

StepFn = Callable[[Batch], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]


def capturable_adam(groups: list[dict[str, Any]], device: torch.device, fused: bool | None,
                    **adam: Any) -> torch.optim.Adam:
    """Adam whose step a CUDA graph can capture: ``capturable`` and every group's rate a 0-d tensor
    on ``device`` (what a captured step reads at each replay); ``adam``: betas, eps."""
    groups = [{**g, "lr": torch.tensor(float(g["lr"]), device=device)} for g in groups]
    return torch.optim.Adam(groups, fused=fused, capturable=True, **adam)


def set_lr(group: dict[str, Any], lr: float) -> None:
    """Set a group's rate: in place where it is a tensor (a captured step reads that tensor)."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


def plain_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state with float rates (a checkpoint reads the same whether or not it was graphed)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


class GraphedStep:
    """One optimiser step on a batch (``loss_of`` -> backward -> clip -> Adam), captured as a
    CUDA graph after ``warmup`` eager steps of the same shapes. Call :meth:`run` per batch."""

    def __init__(self, loss_of: StepFn, accepts: Callable[[Batch], bool], optimizer: torch.optim.Optimizer,
                 clipped: list[list[torch.nn.Parameter]], grad_clip: float, capture: bool, warmup: int = 3) -> None:
        self.loss_of, self.accepts, self.optimizer = loss_of, accepts, optimizer
        self.clipped, self.grad_clip = clipped, grad_clip
        self.capture, self.warmup = capture, warmup
        self.static: Batch | None = None  # the graph's input tensors (their shapes: the only ones it takes)
        self.outputs: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
        self.graph: Any = None  # torch.cuda.CUDAGraph once captured
        self.eager_steps = 0
        self.replays = 0
        self.failed = False  # a capture failed: every later step runs eagerly (logged once)

    @staticmethod
    def _shapes(batch: Batch) -> tuple[Any, ...]:
        return tuple((t.shape, t.dtype, t.device) for t in batch._tensors())

    def run(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """The step's (loss, metrics) tensors, or None where this batch cannot take the fixed-shape
        step (other shapes than the captured ones, or the objective declines it): step eagerly."""
        if self.failed or not self.accepts(batch):
            return None
        if self.static is None:
            self.static = Batch(batch.image_ids, *(t.clone() for t in batch._tensors()), batch.noise)
        elif self._shapes(batch) != self._shapes(self.static):
            return None
        else:
            for dst, src in zip(self.static._tensors(), batch._tensors()):
                dst.copy_(src, non_blocking=True)
            self.static.image_ids, self.static.noise = batch.image_ids, batch.noise
        if self.graph is not None:
            self._replay()
            return self.outputs
        if not self.capture or self.eager_steps < self.warmup:
            return self._eager()
        return self._capture()

    def _body(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        assert self.static is not None
        with timeshared.disabled():
            loss, metrics = self.loss_of(self.static)
            loss.backward()
        if self.grad_clip > 0:
            for params in self.clipped:
                torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.optimizer.step()
        return loss.detach(), metrics

    def _eager(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.optimizer.zero_grad(set_to_none=True)
        out = on_side_stream(self._body) if self.capture else self._body()  # warm-up steps: on a side stream
        self.eager_steps += 1
        return out

    def _capture(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the read-ahead thread (caprl.data.prefetch) pins and copies the next batch meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = self._body()
        except Exception as exc:  # noqa: BLE001 - any capture failure: go on eagerly, loudly
            log.warning("CUDA graph capture of the training step failed (%s: %s): stepping eagerly",
                        type(exc).__name__, exc)
            self.failed = True
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.graph, self.outputs = graph, out
        log.info("training step captured as a CUDA graph after %d eager steps", self.eager_steps)
        self._replay()  # the capture recorded the step; this runs it
        return self.outputs

    def _replay(self) -> None:
        self.graph.replay()
        self.replays += 1
        timeshared.weights_changed()  # the replayed Adam step ran no optimiser hook: no cached weight is valid


def graphed_step(objective: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 clipped: list[list[torch.nn.Parameter]], grad_clip: float, device: torch.device) -> GraphedStep:
    """The trainer's graphed step for ``objective`` (captured on CUDA, eager on a CPU)."""
    return GraphedStep(lambda batch: objective.fixed_loss(model, batch), objective.fixed_step, optimizer, clipped,
                       grad_clip, capture=device.type == "cuda")
