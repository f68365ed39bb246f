"""Sweep and tuning points: one run per point of a run's ``sweep:`` or ``tuning:`` grid.

:func:`expand_sweeps` and :func:`expand_tuning` turn params.yaml's ``runs:`` into the runs the DAG
trains (each point its own job, named by :func:`point_name`); :func:`caprl.params.resolve`
applies both. Apart from ``caprl.params`` so that the params file's reading and checking and the
runs' expansion each read in one sitting; this module reads no file and imports no other stage.
"""

from __future__ import annotations

import itertools
from typing import Any

from caprl.errors import CaprlError

SWEPT_FROM = "swept_from"  # key of an expanded point: the params.yaml run it comes from
TUNED_FROM = "tuned_from"  # key of a tuning point: the run whose options it tries (tuning:)
LISTED_ONLY = "listed_only"  # a run's flag: trained only where a dataset's runs:, a claims config or tuning names it


def named(entry: dict[str, Any]) -> dict[str, Any]:
    """A run's entry where something names it (a claims config, a tuning point): without its ``listed_only``."""
    return {k: v for k, v in entry.items() if k != LISTED_ONLY}


def point_name(run: str, point: dict[str, Any]) -> str:
    """``fc-psst_multinomial`` + {lam: 0.01, rho: 0.25} -> ``fc-psst_multinomial-lam0_01-rho0_25``."""
    def text(value: Any) -> str:
        return format(value, "g").replace(".", "_").replace("-", "m").replace("+", "")

    return "-".join([run, *(f"{option}{text(value)}" for option, value in point.items())])


def expand_sweeps(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every run that has a ``sweep:`` replaced by one run per point of the
    product of its option lists (its own job), named by :func:`point_name`; the swept values
    become the point's ``options``. A list given by name is ``sweeps.<name>``. A dataset's
    ``runs:`` list naming a swept run names all its points. Idempotent (points have no sweep)."""
    runs = params["runs"]
    if not any("sweep" in entry for entry in runs.values()):
        return params
    lists = params.get("sweeps", {})
    expanded: dict[str, Any] = {}
    points_of: dict[str, list[str]] = {}
    for run, entry in runs.items():
        if "sweep" not in entry:
            expanded[run] = entry
            continue
        axes = _axes(lists, entry["sweep"], f"runs.{run}.sweep")
        base = {k: v for k, v in entry.items() if k != "sweep"}
        points_of[run] = []
        for combo in itertools.product(*axes.values()):
            point = dict(zip(axes, combo))
            name = point_name(run, point)
            if name in runs or name in expanded:
                raise CaprlError(f"runs.{run}.sweep: its point {name} is also defined under runs:")
            expanded[name] = {**base, "options": {**base.get("options", {}), **point}, SWEPT_FROM: run}
            points_of[run].append(name)
    out = dict(params)
    out["runs"] = expanded
    datasets = {}
    for name, spec in params["datasets"].items():
        if "runs" in spec:
            spec = {**spec, "runs": [p for run in spec["runs"] for p in points_of.get(run, [run])]}
        datasets[name] = spec
    out["datasets"] = datasets
    return out


def _axes(lists: dict[str, Any], grid: dict[str, Any], key: str) -> dict[str, list[Any]]:
    """Option -> its values (a list, or the name of one under ``sweeps:``)."""
    axes = {}
    for option, values in grid.items():
        if isinstance(values, str):
            if values not in lists:
                raise CaprlError(f"{key}.{option}: '{values}' is not a list under sweeps: ({', '.join(lists) or 'none'})")
            values = lists[values]
        axes[option] = list(values)
    return axes


def expand_tuning(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with one extra run per point of ``tuning.runs.<run>`` (the product of its option
    lists on top of the run's options), named ``<run>-tune-<option><value>...``: training jobs
    whose best validation score chooses the run's values (``snakemake tuning``, caprl.workflow.tuning);
    they are never evaluated on test. Every tuned run must have ``tuning.budget`` points, so
    the methods a table compares get the same tuning budget. Idempotent; run after
    :func:`expand_sweeps` (a swept point may be tuned by its point name)."""
    tuning = params.get("tuning") or {}
    grids = tuning.get("runs") or {}
    runs = params["runs"]
    if not grids or any(TUNED_FROM in entry for entry in runs.values()):
        return params
    expanded, points_of = dict(runs), {}
    for run, grid in grids.items():
        if run not in runs:
            raise CaprlError(f"tuning.runs.{run}: {unknown_run(params, run)}")
        axes = _axes(params.get("sweeps", {}), grid, f"tuning.runs.{run}")
        combos = list(itertools.product(*axes.values()))
        if len(combos) != tuning["budget"]:
            raise CaprlError(f"tuning.runs.{run}: {len(combos)} points, but tuning.budget is {tuning['budget']}: "
                             "every tuned run gets the same number of points, so that the methods compared had "
                             "the same tuning budget")
        entry = {k: v for k, v in named(runs[run]).items() if k != "decode"}
        points_of[run] = []
        for combo in combos:
            point = dict(zip(axes, combo))
            name = point_name(f"{run}-tune", point)
            expanded[name] = {**entry, "options": {**entry.get("options", {}), **point}, TUNED_FROM: run}
            points_of[run].append(name)
    out = dict(params)
    out["runs"] = expanded
    out["datasets"] = {name: ({**spec, "runs": [p for r in spec["runs"] for p in [r, *points_of.get(r, [])]]}
                              if "runs" in spec else spec) for name, spec in params["datasets"].items()}
    return out


def compared_runs(params: dict[str, Any]) -> list[str]:
    """The runs the tables compare: every run but the tuning points."""
    return [run for run, entry in params["runs"].items() if TUNED_FROM not in entry]


def unknown_run(params: dict[str, Any], source: str) -> str:
    """Why ``source`` names no run of the (sweep-expanded) ``runs:``, and what to name instead."""
    points: dict[str, list[str]] = {}
    for name, entry in params["runs"].items():
        if SWEPT_FROM in entry:
            points.setdefault(entry[SWEPT_FROM], []).append(name)
    if source in points:
        return (f"run '{source}' has a sweep: (one run per point), so name one of its points: "
                f"{', '.join(points[source])}")
    for base, names in points.items():
        if source.startswith(f"{base}-"):
            return (f"'{source}' is not a point of the sweep of runs.{base} (check its sweep: and the lists under "
                    f"sweeps:); its points: {', '.join(names)}")
    return f"no run named '{source}' under runs: (runs: {', '.join(params['runs'])})"
