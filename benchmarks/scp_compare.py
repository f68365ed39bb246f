"""Summarise the RL comparison of caprl's trainer with self-critical.pytorch's (SCP): test CIDEr-D.

    python benchmarks/scp_compare.py /tmp/parity/parity-*.json /tmp/parity/scp-*.json [--decoding beam5]

Reads ``scst_parity.py``'s ``parity-<model>.json`` (caprl: every seed's ``<model>-xe``, ``-scst``,
``-nsc`` with its test scores) and ``scp_trainer.py``'s ``--out`` files (SCP: one seed each, stages
``xe``, ``scst``, ``nsc``), and prints, per decoding (greedy, and the beam of params.yaml's decode),
a markdown table: per model and method, each trainer's mean test CIDEr-D (x 100) over its seeds with
the 95% t-interval (mean +- t(0.975, n - 1) s / sqrt(n)), the gain over XE paired within seed (each
seed's RL run minus the XE run it started from; mean and 95% t-interval), and the difference of the
two trainers' gains, caprl - SCP, with Welch's 95% interval (the trainers' seeds are not paired: the
same seed number draws different initialisations and batches in each). Then each trainer's wall
seconds per epoch (training and per-epoch validation) for the cost of a rerun.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from scipy import stats

TRAINERS = ("caprl", "SCP")
METHODS = ("xe", "scst", "nsc")

# (trainer, model, method) -> seed -> {"test": {decoding: CIDEr-D}, "s_per_epoch": float}
Records = dict[tuple[str, str, str], dict[int, dict[str, Any]]]


def load(paths: list[Path]) -> Records:
    records: Records = defaultdict(dict)
    for path in paths:
        r = json.loads(path.read_text())
        if r.get("impl") == "caprl":
            for seed, runs in r["seeds"].items():
                for run, x in runs.items():
                    method = run.rsplit("-", 1)[1]
                    records[("caprl", r["model"], method)][int(seed)] = {
                        "test": {k: v for k, v in x["test"].items() if k != "seconds"},
                        "s_per_epoch": x.get("seconds_per_epoch")}
        elif str(r.get("impl", "")).startswith("self-critical.pytorch") and "caprl_model" in r:
            for method in ("xe", *r.get("methods", [])):
                if method in r:
                    x = r[method]
                    records[("SCP", r["caprl_model"], method)][int(r["seed"])] = {
                        "test": {k: v for k, v in x["test"].items() if k not in ("checkpoint", "seconds")},
                        "s_per_epoch": x.get("seconds_per_epoch")}
        else:
            print(f"{path}: neither scst_parity.py's parity-<model>.json nor scp_trainer.py's output "
                  "with test scores (an older file?): skipped", file=sys.stderr)
    return records


def interval(values: list[float]) -> tuple[float, float | None, int]:
    """Mean and the 95% t-interval's half-width (None below 2 values)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n), n


def welch(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """mean(a) - mean(b) and Welch's 95% half-width (None when either has fewer than 2 values)."""
    diff = sum(a) / len(a) - sum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return diff, None
    va, vb = (sum((v - sum(x) / len(x)) ** 2 for v in x) / (len(x) - 1) / len(x) for x in (a, b))
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, 0.0
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return diff, float(stats.t.ppf(0.975, df)) * se


def cell(mean: float, half: float | None, n: int | None = None) -> str:
    text = f"{mean:.1f}" if half is None else f"{mean:.1f} [{mean - half:.1f}, {mean + half:.1f}]"
    return text + (f" (n={n})" if n is not None else "")


def values(records: Records, key: tuple[str, str, str], decoding: str) -> dict[int, float]:
    return {seed: 100 * x["test"][decoding] for seed, x in records.get(key, {}).items() if decoding in x["test"]}


def gains(records: Records, trainer: str, model: str, method: str, decoding: str) -> list[float]:
    """Each seed's RL test CIDEr-D minus its own XE run's (the seeds that have both)."""
    rl, xe = values(records, (trainer, model, method), decoding), values(records, (trainer, model, "xe"), decoding)
    return [rl[s] - xe[s] for s in sorted(rl) if s in xe]


def table(records: Records, decoding: str) -> list[str]:
    lines = [f"Test CIDEr-D ({decoding}), x 100: mean [95% t-interval] (n = seeds); gains paired within seed; "
             "caprl - SCP: the gains' difference, Welch's 95% interval",
             "", "| model | method | caprl test | SCP test | caprl gain over XE | SCP gain over XE | "
             "caprl - SCP gain |", "|---|---|---|---|---|---|---|"]
    models = sorted({m for (_, m, _) in records})
    for model in models:
        for method in METHODS:
            row = [model, method]
            for trainer in TRAINERS:
                v = list(values(records, (trainer, model, method), decoding).values())
                row.append(cell(*interval(v)) if v else "—")
            if method == "xe":
                row += ["—", "—", "—"]
            else:
                g = {t: gains(records, t, model, method, decoding) for t in TRAINERS}
                row += [cell(*interval(g[t])) if g[t] else "—" for t in TRAINERS]
                row.append(cell(*welch(g["caprl"], g["SCP"])) if g["caprl"] and g["SCP"] else "—")
            if any(c != "—" for c in row[2:]):
                lines.append("| " + " | ".join(row) + " |")
    return lines


def timing(records: Records) -> list[str]:
    lines = ["Wall seconds per epoch (training + per-epoch validation), mean over seeds",
             "", "| model | method | caprl s/epoch | SCP s/epoch |", "|---|---|---|---|"]
    for model in sorted({m for (_, m, _) in records}):
        for method in METHODS:
            row = []
            for trainer in TRAINERS:
                v = [x["s_per_epoch"] for x in records.get((trainer, model, method), {}).values() if x["s_per_epoch"]]
                row.append(f"{sum(v) / len(v):.1f}" if v else "—")
            if row != ["—", "—"]:
                lines.append(f"| {model} | {method} | {row[0]} | {row[1]} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", type=Path, nargs="+", help="parity-<model>.json and scp_trainer.py outputs")
    ap.add_argument("--decoding", action="append", help="greedy, beam5, ... (default: every one found)")
    a = ap.parse_args()
    records = load(a.files)
    if not records:
        raise SystemExit("no records")
    found = sorted({d for seeds in records.values() for x in seeds.values() for d in x["test"]})
    for decoding in a.decoding or found:
        print("\n".join(table(records, decoding)) + "\n")
    print("\n".join(timing(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
