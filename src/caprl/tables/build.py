"""``caprl tables``: build the tables named in params.yaml from the evaluation score files."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Callable

from caprl import io, params as params_mod
from caprl.errors import CaprlError
from caprl.tables.render import Cell, Table

log = logging.getLogger(__name__)

METRICS = [("B@1", "BLEU-1"), ("B@2", "BLEU-2"), ("B@3", "BLEU-3"), ("B@4", "BLEU-4"),
           ("M", "METEOR"), ("R", "ROUGE-L"), ("C", "CIDEr-D"), ("S", "SPICE")]
FORMATS = {"md": Table.markdown, "csv": Table.csv, "tex": Table.latex}

TableBuilder = Callable[[dict[str, Any], dict[str, dict[str, Any]]], Table]
TABLES: dict[str, TableBuilder] = {}


def register_table(name: str) -> Callable[[TableBuilder], TableBuilder]:
    def decorator(fn: TableBuilder) -> TableBuilder:
        TABLES[name] = fn
        return fn

    return decorator


def metric_cells(scores: dict[str, Any] | None, metrics: list[tuple[str, str]] = METRICS) -> list[Cell]:
    """Percentages as in the papers; None where the run or the metric is missing."""
    values = (scores or {}).get("metrics", {})
    return [Cell(100.0 * values[key] if key in values else None) for _, key in metrics]


def unavailable_notes(scores: dict[str, dict[str, Any]]) -> list[str]:
    reasons = {m: r for s in scores.values() for m, r in s.get("unavailable", {}).items()}
    return [f"{m}: not computed ({r})." for m, r in sorted(reasons.items())]


@register_table("main")
def main_table(params: dict[str, Any], scores: dict[str, dict[str, Any]]) -> Table:
    """Every model after XE and after each RL objective, plus the trivial baseline."""
    name = params["dataset"]["name"]
    table = Table("main", f"{name} {params['evaluate']['split']} split: XE and RL (beam {params['decode']['beam_size']})",
                  [short for short, _ in METRICS])
    runs = params["runs"]
    for model in params["models"]:
        for run, spec in runs["xe"].items():
            if spec["model"] == model:
                table.rows.append((f"{model} (XE)", metric_cells(scores.get(run))))
        for run, spec in runs["rl"].items():
            if spec["model"] == model:
                table.rows.append((f"{model} ({spec['objective'].upper()})", metric_cells(scores.get(run))))
    if "most-frequent" in scores:
        table.rows.append(("most frequent training caption", metric_cells(scores["most-frequent"])))
    table.notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing."]
    table.notes += unavailable_notes(scores)
    return table


def load_scores(results_dir: Path, runs: list[str]) -> dict[str, dict[str, Any]]:
    """``<results_dir>/<run>/scores.json`` of every run that has one; a missing run shows as —."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        p = results_dir / run / "scores.json"
        if not p.exists():
            log.warning("no scores for run %s (%s): its cells will show as missing", run, p)
            continue
        report = io.read_json(p, "score file")
        if "run" not in report or "metrics" not in report:
            raise CaprlError(f"{p}: not a caprl score file (needs 'run' and 'metrics')")
        out[report["run"]] = report
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", required=True, help="holds <run>/scores.json of every run")
    parser.add_argument("--out-dir", required=True, help="writes <dataset>_<table>.md, .csv and .tex here")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    runs = list(params["runs"]["xe"]) + list(params["runs"]["rl"]) + ["most-frequent"]
    scores = load_scores(Path(args.results_dir), runs)
    for name in params["tables"]:
        if name not in TABLES:
            raise CaprlError(f"tables: unknown table '{name}'; registered: {', '.join(sorted(TABLES))}")
        table = TABLES[name](params, scores)
        for ext, render in FORMATS.items():
            io.write_text(Path(args.out_dir) / f"{params['dataset']['name']}_{name}.{ext}", render(table))
        log.info("table %s written to %s", name, args.out_dir)
