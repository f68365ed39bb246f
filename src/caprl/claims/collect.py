"""What one seed of a claims configuration contributes: the files its verdicts read
(:func:`seed_inputs`, the inputs of the paper's claims rule) and their values (:func:`collect_seed`).

A seed's workspace (``claims/<paper>/seed<k>/``) is the workflow's layout under that folder. The
tables a claim reads are built here by the pipeline's own table code from the seed's score files,
as ``caprl tables`` builds them: each score file carries its run's *validation* numbers (``caprl
evaluate`` writes them from the checkpoint it evaluates), so an ``auto`` operating point (paper
004's matched CIDEr-D or R@5) is chosen on the validation curves and each method's test numbers are
read where its validation curve reaches it (``caprl.tables.operating.read_curve``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from caprl import io
from caprl import params as params_mod
from caprl.claims.configs import tables_read
from caprl.errors import CaprlError
from caprl.evaluation import validation
from caprl.tables.build import FORMATS, build_tables, load_scores
from caprl.tables.runs import dataset_runs, gold_retrieval_runs
from caprl.workflow.plan import HISTORY, RESULTS, RETRIEVAL, SCORES, build_plan


def seed_inputs(params: dict[str, Any], config: dict[str, Any], plan: Any = None) -> list[str]:
    """The files of one seed the verdicts read, relative to its workspace: every evaluated run's
    score file (and retrieval results), and what the tables the claims read need (``plan``:
    ``params``' where the caller has it)."""
    plan = plan or build_plan(params)
    jobs = [job for ds in plan.datasets for job in plan.evaluated(ds)]
    files = [job.result(SCORES) for job in jobs] + [job.result(RETRIEVAL) for job in jobs if job.retrieval]
    for ds in sorted({ds for ds, _ in seed_table_names(plan, config)}):
        files += [f for f in plan.table_inputs(ds) if f not in files]  # the gold-caption recalls too
    return files


def seed_table_names(plan: Any, config: dict[str, Any]) -> list[tuple[str, str]]:
    """(dataset, table) of every table a seed builds: those its claims read and those its params list
    (averaged over the seeds: :mod:`caprl.claims.seed_tables`)."""
    return sorted(tables_read(config) | {(ds, table) for ds in plan.datasets for table in plan.tables(ds)})


def validation_numbers(workspace: Path, reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``<dataset>/<run>`` -> the val numbers its score file carries (the record of the epoch its
    evaluated checkpoint holds). A score file without them is an error naming it: its tables'
    operating points would be chosen on the test curves."""
    out: dict[str, dict[str, float]] = {}
    for key, report in reports.items():
        dataset, run = key.split("/", 1)
        path = workspace / SCORES.format(dataset=dataset, run=run)
        if validation.SECTION not in report:
            raise CaprlError(f"{path}: no validation numbers (evaluated before caprl evaluate recorded its "
                             "checkpoint's): delete it, and the workflow evaluates the run again")
        out[key] = validation.numbers(report, str(path))
    return out


def seed_tables(params: dict[str, Any], workspace: Path, tables: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """``<dataset>/<table>`` -> {csv, title, notes}: each table built by the pipeline's own code from
    the seed's score and retrieval files; also written to ``<workspace>/claims_tables/`` to look at."""
    expanded = params_mod.resolve(copy.deepcopy(params))
    out: dict[str, dict[str, Any]] = {}
    for ds, name in tables:
        runs = [view.name for view in dataset_runs(expanded, ds)]
        gold = [view.name for view in gold_retrieval_runs(expanded, ds)]
        scores = load_scores(workspace / RESULTS.format(dataset=ds), runs, ds, gold)
        table = build_tables(expanded, ds, scores, [name])[name]
        for ext, render in FORMATS.items():
            io.write_text(workspace / "claims_tables" / f"{ds}_{name}.{ext}", render(table))
        out[f"{ds}/{name}"] = {"csv": FORMATS["csv"](table), "title": table.title, "notes": list(table.notes)}
    return out


def train_seconds(workspace: Path, params: dict[str, Any]) -> float:
    """The seed's training seconds: every epoch's (validation included) of its runs' histories."""
    plan = build_plan(params)
    total = 0.0
    for job in plan.jobs.values():
        path = workspace / HISTORY.format(dataset=job.dataset, run=job.run)
        if path.exists():
            total += sum(float(epoch.get("seconds") or 0.0) for epoch in json.loads(path.read_text())["epochs"])
    return total


def collect_seed(params: dict[str, Any], config: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """One seed's values: every evaluated run's scores (with its retrieval results), their validation
    numbers, its tables (CSV, and their title and notes), its params' seed."""
    plan = build_plan(params)
    out: dict[str, Any] = {"seed": params["seed"], "workspace": str(workspace), "runs": {}, "validation": {},
                           "tables": {}, "table_notes": {}, "train_seconds": round(train_seconds(workspace, params), 2)}
    for ds in plan.datasets:
        for job in plan.evaluated(ds):
            scores = json.loads((workspace / job.result(SCORES)).read_text())
            if job.retrieval:
                retrieval = json.loads((workspace / job.result(RETRIEVAL)).read_text())
                scores["retrieval"] = {k: v for k, v in retrieval.items() if k != "ranks"}
            out["runs"][f"{job.dataset}/{job.run}"] = scores
    out["validation"] = validation_numbers(workspace, out["runs"])
    tables = seed_table_names(plan, config)
    for key, built in seed_tables(params, workspace, tables).items():
        out["tables"][key] = built["csv"]
        out["table_notes"][key] = [built["title"], *built["notes"]]
    return out
