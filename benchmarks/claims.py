"""Claim checks: the runs of a config over several seeds, mean ± standard deviation.

    python benchmarks/claims.py --config configs/claims.yaml      # PG-SPIDEr: XE, SCST, PG-SPIDEr
    python benchmarks/claims.py --config configs/claims_sle.yaml  # SLE: XE, SLL, SLL-ME, SLL-SLE

A config is overrides of params.yaml plus ``seeds:`` and ``report:`` (the score-file
entries to summarise, as dotted paths: ``metrics.CIDEr-D``, ``diversity.rs.Div-2``). For
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
PERCENT = ("metrics.", "diversity.rs.CIDEr-D", "diversity.bs.CIDEr-D")  # shown in %, as the papers do


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def run_seed(params: dict[str, Any], seed: int, workdir: Path, cores: int) -> dict[str, dict[str, Any]]:
    from caprl.workflow_plan import build_plan

    workdir.mkdir(parents=True, exist_ok=True)
    params = {**params, "seed": seed}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    plan = build_plan(params)
    jobs = [job for ds in plan.datasets for job in plan.evaluated(ds)]
    targets = [job.result("results/{dataset}/{run}/scores.json") for job in jobs]
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores", str(cores),
                    *targets], check=True, env=env, cwd=workdir)
    return {f"{job.dataset}/{job.run}": json.loads((workdir / target).read_text())
            for job, target in zip(jobs, targets)}


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
    seeds, report = overrides.pop("seeds"), overrides.pop("report")
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), overrides)
    params["runs"] = overrides["runs"]  # exactly the config's runs
    started = time.time()
    per_seed = {seed: run_seed(params, seed, Path(args.out) / f"seed{seed}", args.cores) for seed in seeds}
    summary: dict[str, Any] = {"config": args.config, "seeds": seeds, "seconds": round(time.time() - started), "runs": {}}
    print(f"{'dataset/run':<34}" + "".join(f"{m.split('.', 1)[1]:>20}" for m in report))
    for key in per_seed[seeds[0]]:
        row = {}
        for path in report:
            values = np.array([entry(per_seed[s][key], path) for s in seeds])
            row[path] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)), "values": values.tolist()}
        summary["runs"][key] = row
        print(f"{key:<34}" + "".join(f"{row[m]['mean']:>12.3f} ± {row[m]['std']:<5.3f}" for m in report))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(seeds)} seeds in {summary['seconds']} s -> {Path(args.out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
