"""``caprl plan``: every job of the workflow plan with its estimated hours and peak memory
(:mod:`caprl.workflow.costs`' estimates), as a table, Markdown or JSON.

    caprl plan --params params.yaml [configs/recipes/<name>.yaml] [--device h100|h200|cpu]
               [--format table|md|json] [--out FILE]

The claims' (``snakemake all_claims``) are ``caprl claims-plan``'s (:mod:`caprl.claims.plan`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from caprl import io, params as params_mod
from caprl.workflow.costs import COSTS, DEVICES, RULE_ORDER, Estimate, Estimator, Row, estimate, load_costs

log = logging.getLogger(__name__)


def totals(rows: list[Row]) -> dict[str, Any]:
    """Jobs and hours per rule kind (the tuning points apart) and overall: sums of the costed rows."""
    kinds: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: RULE_ORDER.index(r.rule) if r.rule in RULE_ORDER else len(RULE_ORDER)):
        entry = kinds.setdefault("train (tuning)" if row.target == "tuning" and row.rule == "train" else row.rule,
                                 {"jobs": 0, "hours": None})
        entry["jobs"] += 1
        if row.hours is not None:
            entry["hours"] = (entry["hours"] or 0.0) + row.hours
    return {"by_rule": kinds, "jobs": len(rows), "hours": math.fsum(r.hours for r in rows if r.hours is not None)}


def hours_text(hours: float | None) -> str:
    if hours is None:
        return "-"
    return "<1 min" if hours < 1 / 60 else f"{hours * 60:.0f} min" if hours < 1 else f"{hours:,.1f} h"


def mib_text(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def render(result: Estimate, fmt: str, device: str, files: list[str], costs: dict[str, Any]) -> str:
    rows, tot = result.rows, totals(result.rows)
    unit, label = ("GPU-hours" if device != "cpu" else "CPU-hours"), costs["devices"][device]["label"]
    if fmt == "json":
        return json.dumps({"params": files, "device": device, "device_label": label, "unit": unit,
                           "datasets": {n: asdict(s) for n, s in result.sizes.items()},
                           "jobs": [asdict(r) for r in rows], "totals": tot}, indent=1) + "\n"
    head = ["job", "steps", "hours", "peak mem", "basis"]
    body = [[r.job, "-" if r.steps is None else f"{r.steps:,}", hours_text(r.hours), mib_text(r.peak_mib), r.basis]
            for r in rows]
    sums = [[kind, str(v["jobs"]), hours_text(v["hours"])] for kind, v in tot["by_rule"].items()]
    sums.append(["total", str(tot["jobs"]), hours_text(tot["hours"])])
    notes = [f"Estimated {unit} on {label} for {' + '.join(files)} (rules: caprl.workflow.costs; figures and their sources: "
             f"caprl/workflow/{COSTS.name}). Memory: peak, estimated.",
             *(f"{n}: {s.train:,} train / {s.val:,} val / {s.test:,} test images ({s.source})"
               for n, s in result.sizes.items()),
             "basis: measured = this device's step figure (scaled to the run by the stated rules); "
             + (f"scaled from CPU = the CPU figure / {Estimator({}, costs, device).cpu_ratio()[0]:.1f} (CPU / "
                f"{device.upper()}, SCST Top-Down, batch 50); " if device != "cpu" else "")
             + "fallback = a stated substitute.",
             "Not counted: jobs without a GPU (-), metric scoring (CPU), early stopping (every epoch is trained)."]
    if fmt == "md":
        table = lambda h, b: "\n".join(["| " + " | ".join(h) + " |", "|" + "---|" * len(h),
                                        *("| " + " | ".join(x) + " |" for x in b)])
        return "\n\n".join([table(head, body), table(["rule", "jobs", unit], sums), "\n".join(f"* {n}" for n in notes)]) + "\n"
    return "\n\n".join([_text_table(head, body), _text_table(["rule", "jobs", unit], sums), "\n".join(notes)]) + "\n"


def _text_table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="h100", help="whose measured step costs (default: h100)")
    parser.add_argument("--format", choices=("table", "md", "json"), default="table")
    parser.add_argument("--out", type=Path, default=None, help="also write the output to this file (atomically)")


def main(args: argparse.Namespace) -> None:
    files = [str(f) for f in args.params]
    costs = load_costs()
    text = render(estimate(params_mod.load(files), args.device, costs), args.format, args.device, files, costs)
    print(text, end="")
    if args.out:
        io.write_text(args.out, text)
        log.info("wrote %s", args.out)
