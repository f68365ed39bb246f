"""Each run's validation numbers, for operating points chosen on validation (paper 004's tables).

A run's evaluated checkpoint (``best.pt``) holds the epoch that its ``history.json`` names as
``best_epoch`` (:func:`caprl.training.run.history_json`; 0: its starting weights). That epoch's
record gives the run's point on its *validation* curve: its ``val_<metric>`` values, i.e. the
val CIDEr-D of the run's evaluation decoding (``train.validate_with: evaluation``) and, for the
runs that hold a listener (paper 004's methods, the frozen speakers), R@1/5/10 of its greedy
captions among the val images (the objectives' ``validation()``, ``greedy_recall``).

:func:`attach` adds them to the score reports a table builder reads, as ``report["validation"]``;
:mod:`caprl.tables.operating` then chooses ``auto`` operating points on the validation curves
and reads the test curves there. ``benchmarks/claims.py`` does so for every seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from caprl import io
from caprl.errors import CaprlError

VALIDATION = "validation"  # the key of a score report's attached validation numbers


def best_record(history: dict[str, Any], where: str = "history") -> dict[str, float]:
    """The ``val_<metric>`` numbers (keys without ``val_``) of the epoch the checkpoint holds;
    {} where no epoch was scored (``best_epoch`` null). CaprlError where the history is not one
    or has no record of its ``best_epoch``."""
    if not isinstance(history, dict) or not isinstance(history.get("epochs"), list):
        raise CaprlError(f"{where}: not a training history (needs 'epochs' and 'best_epoch')")
    best = history.get("best_epoch")
    if best is None:
        return {}
    records = [r for r in history["epochs"] if isinstance(r, dict) and r.get("epoch") == best]
    if not records:
        raise CaprlError(f"{where}: best_epoch {best} has no record among its epochs")
    return {k[len("val_"):]: float(v) for k, v in records[-1].items()
            if k.startswith("val_") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def read(path: Path | str, run: str | None = None) -> dict[str, float]:
    """:func:`best_record` of a ``history.json`` (of ``run`` where given)."""
    history = io.read_json(Path(path), "training history")
    if run is not None and isinstance(history, dict) and history.get("run") not in (None, run):
        raise CaprlError(f"{path}: holds the history of run '{history.get('run')}', not of '{run}'")
    return best_record(history, str(path))


def attach(scores: dict[str, dict[str, Any]], validation: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """A copy of ``scores`` (run -> score report) with each run's validation numbers attached as
    ``report["validation"]`` where ``validation`` (run -> numbers) has any."""
    return {run: ({**report, VALIDATION: dict(validation[run])} if validation.get(run) else report)
            for run, report in scores.items()}
