"""``caprl tune-report``: choose each tuned run's options on the validation split.

``tuning.runs`` in params.yaml gives, per run, option lists (the learning rate, a method's free
options); every point of their product is its own training job (``<run>-tune-lr0_0006``, see
:func:`caprl.run_points.expand_tuning`), built by ``snakemake tuning``, one job per point on a
cluster. A point is scored by the best validation value of its method's own selection metric
(``Objective.select``: CIDEr-D for captioners, the listener's R@10 for paper 004's methods)
over its trained epochs, read from its history; the point with the highest score is the
choice (ties: the first in the grid's order). The test split is never read: points are not
evaluated. Every tuned run has ``tuning.budget`` points, so the methods a table compares had
the same budget. The report says, per run, whether params.yaml already uses the choice; a
researcher copies the choice into params.yaml and cites the report (as params.yaml does).

Outputs: ``results/tuning/<dataset>.md`` (a table per tuned run) and ``.json``::

    {"dataset", "budget", "runs": {run: {"method", "select", "points": [{"run", "options",
     "best", "epoch", "start"}], "chosen": {option: value}, "current": {option: value},
     "tuned_at": label}}}

Re-tuning some runs only (their code or model changed; the others' points still stand):
``--merge OLD.json NEW.json`` writes the report of params.yaml's ``tuning.runs`` from NEW's
entries where it has them, else OLD's, each keeping the ``tuned_at`` label it was made with
(``--tuned-at``: the commit or date of this tuning), so the report says which code chose what.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from caprl import io, params as params_mod
from caprl.errors import CaprlError

log = logging.getLogger(__name__)


def point_score(history: dict[str, Any], select: str, where: str) -> dict[str, Any]:
    """The best validation ``select`` over a point's trained epochs (epoch 0, its starting point, is
    shown but not chosen from: a point that never beats its start still ranks by what it learned)."""
    key = f"val_{select}"
    trained = [e for e in history["epochs"] if e.get("epoch", 0) > 0 and key in e]
    if not trained:
        raise CaprlError(f"{where}: no trained epoch with {key}; re-run the tuning point's training")
    best = max(trained, key=lambda e: e[key])  # the first of equal scores
    start = next((e[key] for e in history["epochs"] if e.get("epoch") == 0 and key in e), None)
    return {"best": float(best[key]), "epoch": int(best["epoch"]), "start": start}


def choose(points: list[dict[str, Any]]) -> int:
    """Index of the point with the highest score; the first of equal ones."""
    scores = [p["best"] for p in points]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def report(params: dict[str, Any], dataset: str, root: Path = Path(".")) -> dict[str, Any]:
    """The tuning report of ``dataset`` from its points' histories (paths of the plan)."""
    from caprl.objectives import OBJECTIVES
    from caprl.workflow.plan import build_plan

    plan = build_plan(params)
    runs: dict[str, Any] = {}
    for run, jobs in plan.tuning_points(dataset).items():
        select = OBJECTIVES.get(jobs[0].spec.method, where=f"runs.{run}.method").select
        grid = params["tuning"]["runs"][run]
        points = []
        for job in jobs:
            path = root / job.history
            if not path.is_file():
                raise CaprlError(f"{path}: history of tuning point {job.run} not found; train it first "
                                 f"(`snakemake {job.history}`)")
            history = io.read_json(path, "a training history")
            options = {option: job.spec.options[option] for option in grid}
            points.append({"run": job.run, "options": options, **point_score(history, select, str(path))})
        chosen = points[choose(points)]
        current = {option: params_mod.run_spec(params, run).options[option] for option in grid}
        runs[run] = {"method": jobs[0].spec.method, "select": select, "points": points,
                     "chosen": chosen["options"], "current": current}
    return {"dataset": dataset, "budget": params["tuning"]["budget"], "runs": runs}


def merge(params: dict[str, Any], old: dict[str, Any], new: dict[str, Any], where: str) -> dict[str, Any]:
    """The report of params' tuning runs from ``new``'s entries where it has them, else ``old``'s
    (a run neither holds is an error: tune it); ``current`` is read again from params."""
    if old["dataset"] != new["dataset"] or old["budget"] != new["budget"] != params["tuning"]["budget"]:
        raise CaprlError(f"{where}: the reports are of other datasets or budgets ({old['dataset']}/{old['budget']}, "
                         f"{new['dataset']}/{new['budget']}, params.yaml's budget {params['tuning']['budget']})")
    runs: dict[str, Any] = {}
    for run, grid in params["tuning"]["runs"].items():
        if new["dataset"] not in params_mod.tuning_datasets(params, run):
            continue
        entry = new["runs"].get(run) or old["runs"].get(run)
        if entry is None:
            raise CaprlError(f"{where}: neither report has tuning points of run {run}; tune it "
                             f"(`snakemake tuning` with tuning.runs naming it)")
        current = {option: params_mod.run_spec(params, run).options[option] for option in grid}
        runs[run] = {**entry, "current": current}
    return {"dataset": new["dataset"], "budget": new["budget"], "runs": runs}


def _value(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def _score(value: float | None) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Tuning on the validation split: {result['dataset']}", "",
             f"Each tuned run's {result['budget']} points were trained on the train split and scored on the val "
             "split by the method's own selection metric (the best of its trained epochs; epoch 0 is where it "
             "started). The test split was not read. **Bold**: the choice.", ""]
    for run, entry in result["runs"].items():
        options = list(entry["chosen"])
        lines += [f"## {run} ({entry['method']}, selected on val {entry['select']})", "",
                  "| " + " | ".join([*options, f"best val {entry['select']}", "at epoch", "start (epoch 0)"]) + " |",
                  "|" + "---|" * (len(options) + 3)]
        for point in entry["points"]:
            chosen = point["options"] == entry["chosen"]
            values = [(f"**{_value(point['options'][o])}**" if chosen else _value(point["options"][o])) for o in options]
            lines.append("| " + " | ".join([*values, _score(point["best"]), str(point["epoch"]),
                                            _score(point["start"])]) + " |")
        same = entry["current"] == entry["chosen"]
        current = ", ".join(f"{k} {_value(v)}" for k, v in entry["current"].items())
        index = [p["options"] for p in entry["points"]].index(entry["chosen"])
        edge = (" The choice is at the grid's edge: a wider grid could do better (a larger budget for every "
                "method compared).") if len(options) == 1 and index in (0, len(entry["points"]) - 1) else ""
        edge += f" Tuned at {entry['tuned_at']}." if entry.get("tuned_at") else ""
        lines += ["", f"params.yaml runs.{run}: {current} — "
                  + ("the choice." if same else "**not the choice**: set it to "
                     + ", ".join(f"{k} {_value(v)}" for k, v in entry["chosen"].items()) + ".") + edge, ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--out-md", required=True)
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--tuned-at", default=None, help="a label (commit, date) recorded in each run's entry (not with --merge)")
    parser.add_argument("--merge", nargs=2, metavar=("OLD", "NEW"), default=None,
                        help="write the report of params.yaml's tuning.runs from NEW's entries, else OLD's "
                             "(re-tuning some runs only); no histories are read")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    if not (params.get("tuning") or {}).get("runs"):
        raise CaprlError(f"{args.params}: tuning.runs is empty: nothing to report")
    if args.merge:
        old, new = (io.read_json(path, "a tuning report") for path in args.merge)
        result = merge(params, old, new, where=" + ".join(args.merge))
    else:
        result = report(params, args.dataset)
        for entry in result["runs"].values():  # a merge keeps each entry's own label
            if args.tuned_at:
                entry["tuned_at"] = args.tuned_at
    io.write_json(args.out_json, result)
    io.write_text(args.out_md, markdown(result) + "\n")
    for run, entry in result["runs"].items():
        log.info("%s: chosen %s (params.yaml: %s)", run, entry["chosen"], entry["current"])
