"""The validation numbers of an evaluated checkpoint: the record of the epoch it holds.

A run's ``best.pt`` holds the epoch its training chose on validation (its ``position``'s
``best_epoch``; 0: its starting weights; None: no epoch was scored) and the training history up
to that epoch (``position["history"]``: the records :func:`caprl.training.run.history_json`
writes to ``history.json`` too). That epoch's record gives the run's point on its *validation*
curve: its ``val_<metric>`` values, i.e. the val CIDEr-D of the run's evaluation decoding
(``train.validate_with: evaluation``) and, for the runs that hold a listener (paper 004's
methods, the frozen speakers), R@1/5/10 of its greedy captions among the val images (the
objectives' ``validation()``, ``greedy_recall``).

``caprl evaluate`` reads them from the checkpoint it evaluates and writes them into the score
file, beside the test metrics of the same weights (:func:`section`)::

    "best_epoch": 3,
    "validation": {"epoch": 3, "metrics": {"CIDEr-D": 1.21, "R@1": 0.41, "R@5": 0.8, "R@10": 0.91}}

(``{"epoch": null, "metrics": {}}`` where no epoch was scored). Paper 004's tables
(:mod:`caprl.tables.operating`) choose their ``auto`` operating points on these validation
curves and read the test curves there; the claims (:mod:`caprl.claims.collect`) read the same sections
(:func:`numbers`). Both come from the evaluated checkpoint itself, so they cannot be of other
weights than the test numbers beside them.
"""

from __future__ import annotations

from typing import Any

from caprl.errors import CaprlError

SECTION = "validation"  # the score file's key of the evaluated checkpoint's validation numbers


def best_record(history: dict[str, Any], where: str = "history") -> dict[str, float]:
    """The ``val_<metric>`` numbers (keys without ``val_``) of the epoch the checkpoint holds, of a
    ``{"best_epoch", "epochs"}`` history; {} where no epoch was scored (``best_epoch`` null).
    CaprlError where the history is not one or has no record of its ``best_epoch``."""
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


def section(position: dict[str, Any] | None, where: str = "checkpoint") -> dict[str, Any]:
    """The score file's ``validation`` section of a checkpoint's ``position``: the epoch it holds and
    that epoch's validation numbers (:func:`best_record` of its history). A checkpoint without a
    position (not written by the trainer) has none: ``{"epoch": None, "metrics": {}}``."""
    position = position or {}
    best = position.get("best_epoch")
    if best is None:
        return {"epoch": None, "metrics": {}}
    history = {"best_epoch": best, "epochs": position.get("history")}
    return {"epoch": best, "metrics": best_record(history, f"{where} (its training history)")}


def numbers(report: dict[str, Any] | None, where: str = "score file") -> dict[str, float]:
    """The validation numbers a score report carries (its ``validation`` section's metrics); {}
    without a section (a report not written by ``caprl evaluate`` from a checkpoint). CaprlError,
    naming ``where``, where the section is malformed or of another epoch than the report's
    ``best_epoch`` (the epoch of the weights its test numbers are of)."""
    found = (report or {}).get(SECTION)
    if found is None:
        return {}
    if not isinstance(found, dict) or not isinstance(found.get("metrics"), dict):
        raise CaprlError(f"{where}: its '{SECTION}' is not a section of caprl evaluate (needs 'epoch' and 'metrics')")
    best = (report or {}).get("best_epoch")
    if "best_epoch" in (report or {}) and found.get("epoch") != best:
        raise CaprlError(f"{where}: its validation numbers are of epoch {found.get('epoch')}, its test numbers of "
                         f"the checkpoint's epoch {best}: not the same weights (re-run caprl evaluate)")
    return {k: float(v) for k, v in found["metrics"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
