"""caprl's side of the SCST comparison with self-critical.pytorch's own trainer (``scp_trainer.py``).

    python benchmarks/scst_parity.py --workdir /tmp/parity --seeds 1 2 3 [--set train.validate_with=greedy]
    python benchmarks/scp_trainer.py --workdir /tmp/parity/data --seed 1 --out /tmp/parity/scp1.json   # SCP's side

The demo's built-in image set is made once (params.yaml's seed: the same images, captions and
features as the README's main command, and as ``scp_trainer.py`` converts for SCP); then, for
each training seed, ``fc-xe`` and ``fc-scst`` are trained by ``caprl train`` with params.yaml's
values and that seed (initialisation, batches, sampling) in ``<workdir>/seed<k>/``. Prints each
run's validation CIDEr-D per epoch (the decoding ``train.validate_with`` names: ``greedy`` is
SCP's, for a side-by-side) and writes them to ``<workdir>/parity.json``. The test split is never read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RUNS = ("fc-xe", "fc-scst")
DATA = ("features_tinycnn.h5", "cider_df.json", "labels.h5", "vocab.json", "annotations.json", "refs_val.json")


def setting(params: dict[str, Any], assignment: str) -> None:
    """``a.b.c=value`` (value read as YAML) into params."""
    key, value = assignment.split("=", 1)
    *path, last = key.split(".")
    node = params
    for part in path:
        node = node.setdefault(part, {})
    node[last] = yaml.safe_load(value)


def base_params(settings: list[str]) -> dict[str, Any]:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"]["synthetic_video"]["enabled"] = False
    params["runs"] = {r: params["runs"][r] for r in RUNS}
    params["tables"] = []
    for assignment in settings:
        setting(params, assignment)
    return params


def make_data(data: Path, params: dict[str, Any], env: dict[str, str]) -> None:
    """The demo's data (params.yaml's seed), built once by the real workflow."""
    if all((data / "data/synthetic" / f).exists() for f in DATA):
        return
    data.mkdir(parents=True, exist_ok=True)
    (data / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with open(data / "snakemake.log", "a", encoding="utf-8") as log:
        subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(data), "--cores", "1",
                        *[f"data/synthetic/{f}" for f in DATA]], env=env, cwd=data, check=True, stdout=log, stderr=log)


def train_seed(workdir: Path, data: Path, params: dict[str, Any], seed: int, env: dict[str, str]) -> dict[str, Any]:
    folder = workdir / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "data").exists():
        (folder / "data").symlink_to(data / "data")
    (folder / "params.yaml").write_text(yaml.safe_dump({**params, "seed": seed}, sort_keys=False))
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    out: dict[str, Any] = {}
    d = "data/synthetic"
    for run in RUNS:
        history = folder / f"runs/synthetic/{run}/history.json"
        started = time.time()
        if not history.exists():
            r = f"runs/synthetic/{run}"
            init = ["--init", "model=runs/synthetic/fc-xe/best.pt"] if run != "fc-xe" else []
            subprocess.run(["caprl", "train", "--params", "params.yaml", "--log", f"logs/{run}.log", "--dataset",
                            "synthetic", "--run", run, "--annotations", f"{d}/annotations.json", "--vocab",
                            f"{d}/vocab.json", "--labels", f"{d}/labels.h5", "--features", f"{d}/features_tinycnn.h5",
                            "--cider-df", f"{d}/cider_df.json", *init, "--checkpoint", f"{r}/best.pt",
                            "--history", str(history.relative_to(folder)), "--state-dir", f"{r}/state"],
                           env=env, cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        h = json.loads(history.read_text())
        out[run] = {"best_epoch": h["best_epoch"], "seconds": round(time.time() - started),
                    "val_cider_d": [round(100 * e["val_CIDEr-D"], 1) for e in h["epochs"]]}
        print(f"seed {seed} {run}: best epoch {h['best_epoch']}, val CIDEr-D {out[run]['val_cider_d']}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--set", action="append", default=[], help="a.b=value over params.yaml (repeatable)")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml")}
    params = base_params(args.set)
    make_data(workdir / "data", base_params([]), env)
    results = {seed: train_seed(workdir, workdir / "data", params, seed, env) for seed in args.seeds}
    (workdir / "parity.json").write_text(json.dumps({"settings": args.set, "seeds": results}, indent=1))
    best = {s: max(r["fc-scst"]["val_cider_d"]) for s, r in results.items()}
    start = {s: r["fc-scst"]["val_cider_d"][0] for s, r in results.items()}
    print("| seed | XE start (val) | SCST best (val) |\n|---|---|---|")
    for s in results:
        print(f"| {s} | {start[s]} | {best[s]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
