"""Claim checks: the runs of a config over several seeds, mean ± standard deviation.

    python benchmarks/claims.py --config configs/claims.yaml      # PG-SPIDEr: XE, SCST, PG-SPIDEr
    python benchmarks/claims.py --config configs/claims_sle.yaml  # SLE: XE, SLL, SLL-ME, SLL-SLE

A config is overrides of params.yaml plus ``seeds:`` and ``report:`` (the score-file
entries to summarise, as dotted paths: ``metrics.CIDEr-D``, ``diversity.rs.Div-2``,
``retrieval.R@10`` for runs with a listener) and optionally ``tables:`` (tables of the
synthetic dataset whose every numeric cell is summarised too, e.g. paper 004's recall at a
matched CIDEr-D: ``psst_table2``; their operating points are found per seed). For
each seed, params.yaml with the overrides (and that seed) is written to ``<out>/seed<k>/``
and the real workflow (``snakemake``) builds every evaluated run's test scores there. Prints
each entry per dataset/run as mean ± standard deviation over the seeds (scores in %, the
diversity ratios as they are) and writes ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
PERCENT = ("metrics.", "lookahead.metrics.", "diversity.rs.CIDEr-D", "diversity.bs.CIDEr-D")  # shown in %, as the papers do


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def run_seed(params: dict[str, Any], seed: int, workdir: Path, cores: int,
             tables: list[str]) -> dict[str, dict[str, Any]]:
    from caprl.workflow_plan import TABLE, build_plan

    workdir.mkdir(parents=True, exist_ok=True)
    params = {**params, "seed": seed}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    plan = build_plan(params)
    jobs = [job for ds in plan.datasets for job in plan.evaluated(ds)]
    targets = [job.result("results/{dataset}/{run}/scores.json") for job in jobs]
    extra = [TABLE.format(dataset=ds, table=t, ext="csv") for ds in plan.datasets for t in tables]
    extra += [path for ds in plan.datasets for path in plan.retrieval_files(ds)]
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores", str(cores),
                    *targets, *extra], check=True, env=env, cwd=workdir)
    out = {}
    for job, target in zip(jobs, targets):
        scores = json.loads((workdir / target).read_text())
        retrieval = workdir / job.result("results/{dataset}/{run}/retrieval.json")
        if retrieval.exists():
            scores["retrieval"] = {k: v for k, v in json.loads(retrieval.read_text()).items() if k != "ranks"}
        out[f"{job.dataset}/{job.run}"] = scores
    for ds in plan.datasets:
        for table in tables:
            out[f"table:{ds}_{table}"] = {"csv": (workdir / TABLE.format(dataset=ds, table=table, ext="csv")).read_text()}
    return out


def table_cells(csv_text: str) -> dict[tuple[str, str], float]:
    """(row label, column) -> number, for every numeric cell of a table's CSV."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(csv_text)))
    header, cells = rows[0], {}
    for row in rows[1:]:
        for column, text in zip(header[1:], row[1:]):
            try:
                cells[(row[0], column)] = float(text)
            except ValueError:
                continue
    return cells


def entry(scores: dict[str, Any], path: str) -> float:
    value: Any = scores
    for key in path.split("."):
        value = value[key]
    return float(value) * (100.0 if path.startswith(PERCENT) else 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="e.g. configs/claims.yaml or configs/claims_sle.yaml")
    parser.add_argument("--out", default="claims")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    overrides = yaml.safe_load(Path(args.config).read_text())
    seeds, report, tables = overrides.pop("seeds"), overrides.pop("report"), overrides.pop("tables", [])
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), overrides)
    params["runs"] = overrides["runs"]  # exactly the config's runs
    started = time.time()
    per_seed = {seed: run_seed(params, seed, Path(args.out) / f"seed{seed}", args.cores, tables) for seed in seeds}
    summary: dict[str, Any] = {"config": args.config, "seeds": seeds, "seconds": round(time.time() - started), "runs": {}}
    print(f"{'dataset/run':<34}" + "".join(f"{m.split('.', 1)[1]:>20}" for m in report))
    for key in per_seed[seeds[0]]:
        if key.startswith("table:"):
            continue
        row = {}
        for path in report:
            try:
                values = np.array([entry(per_seed[s][key], path) for s in seeds])
            except KeyError:  # e.g. retrieval.R@10 of a run without a listener
                continue
            row[path] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)), "values": values.tolist()}
        summary["runs"][key] = row
        print(f"{key:<34}" + "".join(f"{row[m]['mean']:>12.3f} ± {row[m]['std']:<5.3f}" if m in row else f"{'—':>20}"
                                     for m in report))
    summary["tables"] = {}
    for key in (k for k in per_seed[seeds[0]] if k.startswith("table:")):
        cells = [table_cells(per_seed[s][key]["csv"]) for s in seeds]
        print(f"\n{key[6:]} (mean ± std over seeds; n = seeds with a value)")
        rows: dict[str, dict[str, Any]] = {}
        for cell in dict.fromkeys(c for seed_cells in cells for c in seed_cells):
            values = np.array([c[cell] for c in cells if cell in c])
            rows.setdefault(cell[0], {})[cell[1]] = {"mean": float(values.mean()), "values": values.tolist(),
                                                     "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0}
        for label, columns in rows.items():
            print(f"  {label:<40}" + "  ".join(f"{c} {v['mean']:.1f}±{v['std']:.1f} (n={len(v['values'])})"
                                              for c, v in columns.items()))
        summary["tables"][key[6:]] = rows
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(seeds)} seeds in {summary['seconds']} s -> {Path(args.out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
