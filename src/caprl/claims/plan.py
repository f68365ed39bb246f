"""``caprl claims-plan``: the papers' claims (``snakemake all_claims``) before anything is
submitted: each enabled claims configuration's jobs and GPU-hours over its seeds.

    caprl claims-plan --params params.yaml [--device h100|h200|cpu] [--seeds N] [--pilot DIR] [--format table|md|json]

The estimates are ``caprl plan``'s (:mod:`caprl.workflow.costs`); a claims seed is the workflow
with that seed's params (:func:`caprl.claims.configs.seed_params`), so its cost is the same for
every seed: one seed's estimate times the seeds (the jobs its scores need: no table files, curves
or figures), plus the paper's verdicts job (not costed: no GPU). Under a recipe a real dataset's
data jobs count once: every seed reads the project's data (hard links). With ``--pilot DIR`` (an
earlier claims result), the seeds each claim needs to resolve an effect of the paper's size
(:mod:`caprl.claims.power`), printed before the main run so its seed count is fixed in advance.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from caprl import io, params as params_mod
from caprl.claims import configs as claims_configs, power
from caprl.claims.collect import seed_table_names
from caprl.errors import CaprlError
from caprl.workflow.costs import DEVICES, estimate, load_costs
from caprl.workflow.plan import build_plan
from caprl.workflow.plan_report import _text_table, hours_text

log = logging.getLogger(__name__)

# what a claims seed does not build: its verdicts read score files (and build the tables they read
# in-process, from the runs' and the baseline's scores), never the tables' files, curves or figures
CLAIMS_SKIP = {"tables", "curves", "psst_figures", "attention_figure"}
# a real dataset's data rules and the files each writes that a seed reads (workflow/rules/data.smk's
# shared_data links them; extraction's shards are read by merge_features only)
LINKED = {"prepare": 1, "vocab": 2, "references": 1, "cider_df": 1, "features": 0, "merge_features": 1,
          "bottomup_features": 1}


@dataclass
class ClaimsCost:
    """One paper's claims: its seeds, and the jobs and hours of all of them (verdicts job included)."""

    paper: str
    config: str
    seeds: int
    claims: int
    outside: int
    jobs: int
    hours: float


def claims_costs(base: dict[str, Any], device: str, costs: dict[str, Any], seeds: int | None = None) -> list[ClaimsCost]:
    """Each enabled claims configuration of ``base`` (params, any recipe over it: unresolved, as
    Snakemake's config) costed over its seeds (``seeds``: that many instead of the config's)."""
    spec = base["claims"]
    out = []
    for paper, path in claims_configs.config_paths(Path(spec["configs"]), spec["papers"]).items():
        config = claims_configs.load_config(path, spec["min_seeds"])
        n = seeds or len(config["seeds"])
        try:
            params = params_mod.resolve(claims_configs.seed_params(base, config, config["seeds"][0]))
            params_mod.check(params)
            plan = build_plan(params)
            config = claims_configs.bind(config, params, plan)
        except CaprlError as exc:
            raise CaprlError(f"{path}: {exc}") from exc
        tables = seed_table_names(plan, config)  # built in-process from the baseline's scores too
        skip = CLAIMS_SKIP | (set() if tables else {"baseline", "gold_retrieval"})
        rows = [r for r in estimate(params, device, costs).rows if r.rule not in skip]
        # a real dataset's data: made once for every seed, each of its files hard-linked into each seed
        real = {ds for ds, spec in params["datasets"].items() if not spec.get("generate")}
        once = [r for r in rows if r.rule in LINKED and r.dataset in real]
        per_seed = [r for r in rows if r not in once]
        links = sum(LINKED[r.rule] for r in once)
        hours = n * math.fsum(r.hours for r in per_seed if r.hours is not None) + math.fsum(
            r.hours for r in once if r.hours is not None)
        out.append(ClaimsCost(paper, str(path), n, len(config["claims"]), len(config["outside"]),
                              n * (len(per_seed) + links) + len(once) + 1, hours))
    return out


def render_claims(rows: list[ClaimsCost], fmt: str, device: str, costs: dict[str, Any]) -> str:
    unit = "GPU-hours" if device != "cpu" else "CPU-hours"
    if fmt == "json":
        return json.dumps({"claims": [asdict(r) for r in rows], "device": device, "unit": unit}, indent=1) + "\n"
    head = ["claims", "resolved here (outside)", "seeds", "jobs", unit]
    body = [[f"{r.paper} ({Path(r.config).name})", f"{r.claims} ({r.outside})", str(r.seeds), f"{r.jobs:,}",
             hours_text(r.hours)] for r in rows]
    body.append(["total", f"{sum(r.claims for r in rows)} ({sum(r.outside for r in rows)})", "",
                 f"{sum(r.jobs for r in rows):,}", hours_text(math.fsum(r.hours for r in rows))])
    note = (f"snakemake all_claims on {costs['devices'][device]['label']}: every seed is the workflow with its "
            "claims params (docs/benchmark.md); one seed's estimate times the seeds, plus one verdicts job per paper. "
            "Outside: claims whose runs or tables these params do not build (no verdict).")
    if fmt == "md":
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                          *("| " + " | ".join(x) + " |" for x in body)]) + f"\n\n{note}\n"
    return _text_table(head, body) + f"\n\n{note}\n"


def pilot_power(base: dict[str, Any], pilot: Path, seeds: int | None) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Per enabled paper, its claims' seeds needed from the pilot's ``<paper>.json`` (caprl.claims.power),
    and their table."""
    spec = base["claims"]
    out: dict[str, list[dict[str, Any]]] = {}
    lines = ["", f"Seeds each claim needs (two-sided paired t-test at {power.ALPHA}, power {power.POWER:.0%}: its "
             f"95% interval excludes 0 for an effect of the paper's size), from the pilot's spread ({pilot}):", "",
             "| paper | claim | paper's effect (read from) | pilot sd of the differences | seeds needed |",
             "|---|---|---|---|---|"]
    for paper, path in claims_configs.config_paths(Path(spec["configs"]), spec["papers"]).items():
        config = claims_configs.load_config(path, spec["min_seeds"])
        stored = pilot / f"{paper}.json"
        out[paper] = power.claim_power(config, io.read_json(stored, "a claims result") if stored.exists() else None)
        lines += power.power_markdown(paper, out[paper], seeds or len(config["seeds"]))
    return out, "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="h100", help="whose measured step costs (default: h100)")
    parser.add_argument("--format", choices=("table", "md", "json"), default="table")
    parser.add_argument("--seeds", type=int, default=None, metavar="N",
                        help="cost N seeds per paper instead of each configuration's own")
    parser.add_argument("--pilot", type=Path, default=None, metavar="DIR",
                        help="an earlier claims result (<paper>.json, e.g. results/claims): the seeds each claim needs")
    parser.add_argument("--out", type=Path, default=None, help="also write the output to this file (atomically)")


def main(args: argparse.Namespace) -> None:
    files = [str(f) for f in args.params]
    costs = load_costs()
    params_mod.load(files)  # validated, errors naming the file
    base = params_mod.read(files)
    text = render_claims(claims_costs(base, args.device, costs, args.seeds), args.format, args.device, costs)
    if args.pilot:
        needed, table = pilot_power(base, args.pilot, args.seeds)
        text = (json.dumps({**json.loads(text), "power": needed}, indent=1) + "\n" if args.format == "json"
                else text + table)
    print(text, end="")
    if args.out:
        io.write_text(args.out, text)
        log.info("wrote %s", args.out)
