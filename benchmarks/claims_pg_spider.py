"""PG-SPIDEr claim check: 3 seeds of XE, SCST and PG-SPIDEr (CIDEr-D) on the synthetic images.

    python benchmarks/claims_pg_spider.py [--config configs/claims.yaml] [--out claims/]

For each seed, ``params.yaml`` with the config's overrides (and that seed) is written to
``<out>/seed<k>/``, and the real workflow (``snakemake``) builds the runs' test scores there.
Prints the official metrics per run as mean ± standard deviation over the seeds and writes
``<out>/summary.json``.
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
METRICS = ["BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D"]


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def run_seed(params: dict[str, Any], seed: int, workdir: Path, cores: int) -> dict[str, dict[str, Any]]:
    workdir.mkdir(parents=True, exist_ok=True)
    params = {**params, "seed": seed}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    datasets = [ds for ds, spec in params["datasets"].items() if spec.get("enabled", True)]
    targets = [f"results/{ds}/{run}/scores.json" for ds in datasets for run in params["runs"]]
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores", str(cores),
                    *targets], check=True, env=env, cwd=workdir)
    return {f"{ds}/{run}": json.loads((workdir / f"results/{ds}/{run}/scores.json").read_text())
            for ds in datasets for run in params["runs"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "claims.yaml"))
    parser.add_argument("--out", default="claims")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    overrides = yaml.safe_load(Path(args.config).read_text())
    seeds = overrides.pop("seeds")
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), overrides)
    params["runs"] = overrides["runs"]  # exactly the config's runs
    started = time.time()
    per_seed = {seed: run_seed(params, seed, Path(args.out) / f"seed{seed}", args.cores) for seed in seeds}
    summary: dict[str, Any] = {"config": args.config, "seeds": seeds, "seconds": round(time.time() - started), "runs": {}}
    print(f"{'run':<36}" + "".join(f"{m:>18}" for m in METRICS))
    for key in per_seed[seeds[0]]:
        row = {}
        for metric in METRICS:
            values = np.array([per_seed[s][key]["metrics"][metric] for s in seeds], dtype=float) * 100
            row[metric] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)), "values": values.tolist()}
        summary["runs"][key] = row
        print(f"{key:<36}" + "".join(f"{row[m]['mean']:>11.2f} ± {row[m]['std']:<5.2f}" for m in METRICS))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(seeds)} seeds in {summary['seconds']} s -> {Path(args.out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
