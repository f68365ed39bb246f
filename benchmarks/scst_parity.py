"""caprl's side of the RL comparison with self-critical.pytorch's own trainer (``scp_trainer.py``).

    python benchmarks/scst_parity.py --workdir /tmp/parity --model transformer --seeds 1 2 3 \\
        --set train.validate_with=greedy
    python benchmarks/scp_trainer.py --workdir /tmp/parity/data --model transformer --seed 1 \\
        --out /tmp/parity/scp-transformer-1.json   # SCP's side, seeds 1, 2, 3
    python benchmarks/scp_compare.py /tmp/parity/parity-transformer.json /tmp/parity/scp-transformer-*.json

``--model fc|topdown|transformer`` picks the demo's runs of that model in params.yaml: ``<m>-xe``,
then from its best checkpoint ``<m>-scst`` and, where params.yaml has it, ``<m>-nsc`` (topdown,
transformer; fc has none). The demo's built-in image set is made once (params.yaml's seed: the same
images, captions and features as the README's main command, and as ``scp_trainer.py`` converts for
SCP) in ``<workdir>/data``; then, for each training seed, the runs are trained by ``caprl train``
with params.yaml's values and that seed (initialisation, batches, sampling) in
``<workdir>/<model>-seed<k>/`` (a run with a history there is kept: rerunning resumes), and each
run's best checkpoint is scored on the test split by ``caprl evaluate``: beam search of
``decode:`` and greedy decoding (``evaluate.greedy``), CIDEr-D only (``evaluate.metrics``; no
diversity sets, no CLIP-S). Prints each run's validation CIDEr-D per epoch (the decoding
``train.validate_with`` names: ``greedy`` is SCP's, for a side-by-side) and its test CIDEr-D, and
writes them to ``<workdir>/parity-<model>.json`` (test scores as fractions, as ``scp_trainer.py``'s;
``seconds_per_epoch``: the run's wall time, start-up and per-epoch validation included, over its
epochs; ``train_seconds_per_epoch``: the history's mean epoch time, the training steps alone).
``--xe-epochs`` / ``--scst-epochs`` shorten a smoke run (the latter: every RL run's epochs);
``--params`` reads another params file (default the repository's params.yaml).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MODELS = ("fc", "topdown", "transformer")
METHODS = ("xe", "scst", "nsc")
DATA = ("features_tinycnn.h5", "cider_df.json", "labels.h5", "vocab.json", "annotations.json", "refs_val.json",
        "refs_test.json")


def setting(params: dict[str, Any], assignment: str) -> None:
    """``a.b.c=value`` (value read as YAML) into params."""
    key, value = assignment.split("=", 1)
    *path, last = key.split(".")
    node = params
    for part in path:
        node = node.setdefault(part, {})
    node[last] = yaml.safe_load(value)


def model_runs(params: dict[str, Any], model: str) -> list[str]:
    """``<model>-xe``, ``<model>-scst``, ``<model>-nsc``: those params.yaml has."""
    runs = [f"{model}-{m}" for m in METHODS if f"{model}-{m}" in params["runs"]]
    if runs[:2] != [f"{model}-xe", f"{model}-scst"]:
        raise SystemExit(f"params.yaml lacks {model}-xe or {model}-scst (has {runs})")
    return runs


def base_params(path: Path, runs: list[str], settings: list[str]) -> dict[str, Any]:
    params = yaml.safe_load(path.read_text())
    params["datasets"]["synthetic_video"]["enabled"] = False
    params["runs"] = {r: params["runs"][r] for r in runs}
    params.setdefault("tuning", {})["runs"] = {r: v for r, v in (params.get("tuning") or {}).get("runs", {}).items()
                                               if r in runs}
    params["tables"] = []
    # the test scoring: CIDEr-D of the beam (decode:) and greedy captions only
    ev = params["evaluate"]
    ev["metrics"], ev["greedy"] = ["cider_d"], True
    ev["diversity"]["methods"] = []
    ev["clip_score"]["embedding"] = "none"
    for assignment in settings:
        setting(params, assignment)
    return params


def make_data(data: Path, params: dict[str, Any], env: dict[str, str]) -> None:
    """The demo's data (params.yaml's seed), built once by the real workflow (concurrent runs on one
    workdir wait for the first)."""
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_data_locked(data, params, env)


def make_data_locked(data: Path, params: dict[str, Any], env: dict[str, str]) -> None:
    if all((data / "data/synthetic" / f).exists() for f in DATA):
        return
    (data / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with open(data / "snakemake.log", "a", encoding="utf-8") as log:
        subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(data), "--cores", "1",
                        *[f"data/synthetic/{f}" for f in DATA]], env=env, cwd=data, check=True, stdout=log, stderr=log)


def caprl(command: list[str], folder: Path, env: dict[str, str], log: str) -> None:
    """One ``caprl`` command in the seed's folder; its output to logs/<log>.out (shown on failure)."""
    out = folder / "logs" / f"{log}.out"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        rc = subprocess.run(["caprl", *command], env=env, cwd=folder, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"caprl {command[0]} {log} failed (rc {rc}): see {out}\n" + out.read_text()[-3000:])


def test_scores(scores: Path, beam: int) -> dict[str, float]:
    """caprl evaluate's scores.json: CIDEr-D of the decode: captions and of the greedy ones (fractions)."""
    s = json.loads(scores.read_text())
    metrics = s.get("metrics") or s.get("corpus") or {}
    return {"greedy": round(float(s["greedy"]["metrics"]["CIDEr-D"]), 4),
            f"beam{beam}": round(float(metrics["CIDEr-D"]), 4)}


def train_seed(workdir: Path, data: Path, params: dict[str, Any], runs: list[str], model: str, seed: int,
               env: dict[str, str]) -> dict[str, Any]:
    folder = workdir / f"{model}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "data").exists():
        (folder / "data").symlink_to(data / "data")
    (folder / "params.yaml").write_text(yaml.safe_dump({**params, "seed": seed}, sort_keys=False))
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    decode = params["decode"]
    if decode["method"] != "beam":
        raise SystemExit(f"decode.method {decode['method']}: the test scoring reads beam and greedy")
    out: dict[str, Any] = {}
    d = "data/synthetic"
    inputs = ["--annotations", f"{d}/annotations.json", "--vocab", f"{d}/vocab.json", "--labels", f"{d}/labels.h5",
              "--features", f"{d}/features_tinycnn.h5"]
    for run in runs:
        r = f"runs/synthetic/{run}"
        history = folder / r / "history.json"
        started = time.time()
        if not history.exists():
            init = ["--init", f"model=runs/synthetic/{model}-xe/best.pt"] if run != f"{model}-xe" else []
            caprl(["train", "--params", "params.yaml", "--log", f"logs/{run}.log", "--dataset", "synthetic", "--run",
                   run, *inputs, "--cider-df", f"{d}/cider_df.json", *init, "--checkpoint", f"{r}/best.pt",
                   "--history", f"{r}/history.json", "--state-dir", f"{r}/state"], folder, env, f"train-{run}")
            (folder / r / "seconds.json").write_text(json.dumps({"seconds": round(time.time() - started, 1)}))
        h = json.loads(history.read_text())
        seconds = json.loads((folder / r / "seconds.json").read_text())["seconds"] \
            if (folder / r / "seconds.json").exists() else None
        epochs = [e for e in h["epochs"] if e.get("epoch", 1) > 0]  # the RL runs' epoch 0: the start, not trained
        e_started = time.time()
        caprl(["evaluate", "--params", "params.yaml", "--log", f"logs/evaluate-{run}.log", "--dataset", "synthetic",
               "--run", run, "--checkpoint", f"{r}/best.pt", *inputs, "--refs", f"{d}/refs_test.json",
               "--out-captions", f"{r}/test_captions.json", "--out-scores", f"{r}/test_scores.json",
               "--out-examples", f"{r}/test_examples.json"], folder, env, f"evaluate-{run}")
        test = test_scores(folder / r / "test_scores.json", int(decode["beam_size"]))
        out[run] = {"best_epoch": h["best_epoch"], "seconds": seconds,
                    "seconds_per_epoch": round(seconds / len(epochs), 1) if seconds and epochs else None,
                    "train_seconds_per_epoch": round(sum(e["seconds"] for e in epochs) / len(epochs), 1)
                    if epochs else None,
                    "val_cider_d": [round(100 * e["val_CIDEr-D"], 1) for e in h["epochs"]],
                    "test": {**test, "seconds": round(time.time() - e_started, 1)}}
        print(f"seed {seed} {run}: best epoch {h['best_epoch']}, val CIDEr-D {out[run]['val_cider_d']}, "
              f"test CIDEr-D {test}, {out[run]['seconds_per_epoch']} s/epoch", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--model", choices=MODELS, default="fc", help="the demo's <model>-xe, -scst, -nsc runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml", help="caprl's parameters")
    parser.add_argument("--xe-epochs", type=int, help="smoke runs: the XE run's epochs")
    parser.add_argument("--scst-epochs", type=int, help="smoke runs: every RL run's epochs")
    parser.add_argument("--set", action="append", default=[], help="a.b=value over params.yaml (repeatable)")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml")}
    full = yaml.safe_load(args.params.read_text())
    runs = model_runs(full, args.model)
    settings = list(args.set)
    if args.xe_epochs:
        settings.append(f"runs.{args.model}-xe.options.epochs={args.xe_epochs}")
    if args.scst_epochs:
        settings += [f"runs.{r}.options.epochs={args.scst_epochs}" for r in runs[1:]]
    params = base_params(args.params, runs, settings)
    make_data(workdir / "data", base_params(args.params, runs, []), env)
    results = {seed: train_seed(workdir, workdir / "data", params, runs, args.model, seed, env) for seed in args.seeds}
    out = workdir / f"parity-{args.model}.json"
    out.write_text(json.dumps({"impl": "caprl", "model": args.model, "runs": runs, "settings": settings,
                               "params": str(args.params), "seeds": results}, indent=1))
    beam = f"beam{params['decode']['beam_size']}"
    print(f"{out}\n| seed | run | best epoch | val CIDEr-D (best) | test greedy | test {beam} | s/epoch |\n"
          "|---|---|---|---|---|---|---|")
    for s, r in results.items():
        for run in runs:
            x = r[run]
            print(f"| {s} | {run} | {x['best_epoch']} | {max(x['val_cider_d'])} | {100 * x['test']['greedy']:.1f} | "
                  f"{100 * x['test'][beam]:.1f} | {x['seconds_per_epoch']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
