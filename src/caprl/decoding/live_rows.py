"""The rows a CPU decode still steps: ended captions are dropped from the batch as they end.

On a CPU a decode step costs in proportion to its rows, and most captions end well before the
longest (8 words against 16 steps on the synthetic sets), so stepping ended rows wastes most of
a decode's tail, and of its backward. :class:`LiveRows` drops them when a quarter of the rows
still stepped have ended, and puts each step's outputs back at their full-batch rows (zeros for
ended rows, which the decode's mask zeroes anyway). The numbers stay those of stepping every
row: a sample's noise is the full batch's (:meth:`LiveRows.of`), and so are a training decode's
dropout masks (:meth:`LiveRows.stepping`, :class:`caprl.models.base.RowDropout`). Not on CUDA:
counting the live rows reads the device, which a GPU decode never does (and a replayed graph
needs fixed shapes).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from caprl.models.base import map_batch, stepped_rows

SHRINK_AT = 0.75  # drop the ended rows once at most this fraction of the stepped rows is live


class LiveRows:
    """Which rows of a ``rows``-row decode are still stepped (all of them until the first shrink)."""

    def __init__(self, rows: int, enabled: bool) -> None:
        self.rows, self.enabled = rows, enabled
        self.index: torch.Tensor | None = None  # full-batch rows of the stepped ones; None: all

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """A stepped-rows output ``[n, ...]`` at its full-batch rows ``[rows, ...]`` (differentiable)."""
        if self.index is None:
            return x
        return x.new_zeros(self.rows, *x.shape[1:]).index_copy(0, self.index, x)

    def stepping(self) -> contextlib.AbstractContextManager[None]:
        """Around a model step: its dropout masks are the full batch's rows of the stepped rows."""
        return stepped_rows(self.rows, self.index)

    def of(self, x: torch.Tensor) -> torch.Tensor:
        """The stepped rows of a full-batch tensor (the step's sampling noise)."""
        return x if self.index is None else x.index_select(0, self.index)

    def shrink(self, finished: torch.Tensor, *batches: Any) -> tuple[Any, ...] | None:
        """``batches`` (ctx, state, ...) without the rows whose every stage has ended, if enough have."""
        if not self.enabled:
            return None
        alive = ~finished.all(dim=1)
        n = int(alive.sum())
        if n == 0 or n > SHRINK_AT * finished.shape[0]:
            return None
        keep = alive.nonzero().squeeze(1)
        self.index = keep if self.index is None else self.index.index_select(0, keep)
        return tuple(map_batch(lambda t: t.index_select(0, keep), b) for b in batches)
