"""Every paper's claims, resolved: paired seeds, a 95% interval of each difference, a verdict.

    python benchmarks/claims.py --paper 001            # one paper: configs/claims/001_*.yaml
    python benchmarks/claims.py --all --readme         # every paper, then README.md's summary

A claims configuration (``configs/claims/<paper>_<name>.yaml``) holds the paper's claims and
``params:``, overrides of params.yaml (its ``runs:`` replace params.yaml's) sized to resolve
them: at least 5 seeds and 1,000 test images, the values of params.yaml (chosen on validation by
``snakemake tuning``) unless the config says otherwise. For each seed, params.yaml with the
overrides and that seed (data, initialisation, sampling: everything) is written to
``<workdir>/<paper>/seed<k>/`` and the real workflow (``snakemake``) builds every evaluated run's
test scores and the tables the claims read; within a seed all methods start from the same XE
run, so differences are paired. A claim compares two values of every seed:

* ``a``/``b``: ``<dataset>/<run>`` with ``metric`` (a path into its score file:
  ``metrics.CIDEr-D``, ``diversity.rs.Div-2``, ``lookahead.metrics.CIDEr-D``, ``retrieval.R@10``;
  ``b_metric``: another path for side b, e.g. one run's lookahead against its beam search),
  or ``{table: <table>, row: <row label>, column: <column>}`` (a cell of the dataset's table
  CSV, e.g. paper 004's recall at a matched CIDEr-D);
* ``kind``: ``greater`` (a > b), ``less`` (a < b), ``at_least`` (a >= b - ``margin``).

The difference d = a - b (b - a for ``less``) of each seed gives the mean and the 95% Student-t
interval over seeds; the verdict is ``holds`` if the interval lies above 0 (above -margin for
``at_least``), ``reversed`` if it lies below 0 (below -margin), else ``unresolved``. Language
metrics are in % (as the papers print them), diversity ratios and recalls as written.

Writes ``results/claims/<paper>.md`` and ``.json`` (every seed's values) and
``results/claims/summary.md`` (every paper's claims found there); ``--readme`` copies the
summary, with the commit and date, between the claims markers of README.md.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "claims"
PERCENT = ("metrics.", "lookahead.metrics.", "diversity.rs.CIDEr-D", "diversity.bs.CIDEr-D")
KINDS = ("greater", "less", "at_least")
README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"
MIN_SEEDS = 5


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def config_path(paper: str) -> Path:
    found = sorted(CONFIGS.glob(f"{paper}_*.yaml"))
    if len(found) != 1:
        raise SystemExit(f"expected one configs/claims/{paper}_*.yaml, found {[p.name for p in found]}")
    return found[0]


def load_config(path: Path) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text())
    for key in ("paper", "title", "seeds", "params", "claims"):
        if key not in config:
            raise SystemExit(f"{path}: missing key {key!r}")
    for claim in config["claims"]:
        if claim.get("kind") not in KINDS:
            raise SystemExit(f"{path}: claim {claim.get('id')}: kind must be one of {KINDS}")
    return config


def seed_params(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """params.yaml with the config's overrides and the seed. Its ``runs:`` replace params.yaml's: a
    list names params.yaml's runs (their values, chosen on validation, as they stand), a mapping
    gives the entries; ``run_overrides:`` then merges into named runs' entries (e.g. another sweep)."""
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    overrides = {k: v for k, v in config["params"].items() if k not in ("runs", "run_overrides")}
    params = merge(base, overrides)
    runs = config["params"]["runs"]
    if isinstance(runs, list):
        unknown = [r for r in runs if r not in base["runs"]]
        if unknown:
            raise SystemExit(f"claims config: runs {unknown} are not in params.yaml's runs:")
        runs = {r: base["runs"][r] for r in runs}
    params["runs"] = copy.deepcopy(runs)
    for run, entry in config["params"].get("run_overrides", {}).items():
        params["runs"][run] = merge(params["runs"][run], entry)
    params["tuning"] = {"budget": params["tuning"]["budget"], "runs": {}}  # the claims train no tuning points
    params["seed"] = seed
    return params


def tables_read(config: dict[str, Any]) -> set[tuple[str, str]]:
    """(dataset, table) of every table cell a claim reads."""
    out = set()
    for claim in config["claims"]:
        for side in ("a", "b"):
            ref = claim[side]
            if isinstance(ref, dict):
                out.add((ref.get("dataset", claim.get("dataset", "synthetic")), ref["table"]))
    return out


def run_seed(config: dict[str, Any], seed: int, workdir: Path, cores: int) -> dict[str, Any]:
    """Build the seed's scores (and the tables the claims read) with the real workflow; collect them."""
    from caprl.workflow_plan import RETRIEVAL, SCORES, TABLE, build_plan

    workdir = workdir.resolve()  # snakemake runs in it (cwd) and is told it (--directory): one absolute path
    workdir.mkdir(parents=True, exist_ok=True)
    params = seed_params(config, seed)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    plan = build_plan(params)
    jobs = [job for ds in plan.datasets for job in plan.evaluated(ds)]
    tables = sorted(tables_read(config))
    targets = [job.result(SCORES) for job in jobs] + [job.result(RETRIEVAL) for job in jobs if job.retrieval]
    targets += [TABLE.format(dataset=ds, table=t, ext="csv") for ds, t in tables]
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    started = time.time()
    with open(workdir / "snakemake.log", "a", encoding="utf-8") as log:
        done = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores",
                               str(cores), "--keep-going", *targets], env=env, cwd=workdir, stdout=log, stderr=log)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: the workflow failed; see {workdir / 'snakemake.log'} and {workdir / 'logs'}")
    out: dict[str, Any] = {"seconds": round(time.time() - started), "runs": {}, "tables": {}}
    for job in jobs:
        scores = json.loads((workdir / job.result(SCORES)).read_text())
        if job.retrieval:
            retrieval = json.loads((workdir / job.result(RETRIEVAL)).read_text())
            scores["retrieval"] = {k: v for k, v in retrieval.items() if k != "ranks"}
        out["runs"][f"{job.dataset}/{job.run}"] = scores
    for ds, table in tables:
        out["tables"][f"{ds}/{table}"] = (workdir / TABLE.format(dataset=ds, table=table, ext="csv")).read_text()
    return out


def table_cell(csv_text: str, row: str, column: str, where: str) -> float:
    rows = list(csv.reader(io.StringIO(csv_text)))
    header = rows[0]
    if column not in header:
        raise KeyError(f"{where}: no column {column!r} (columns: {header})")
    for line in rows[1:]:
        if line[0] == row:
            text = line[header.index(column)]
            return float(re.sub(r"[^0-9.eE+-]", "", text)) if text.strip() not in ("", "—") else math.nan
    raise KeyError(f"{where}: no row {row!r} (rows: {[r[0] for r in rows[1:]]})")


def value_of(seed: dict[str, Any], claim: dict[str, Any], side: str) -> float:
    """Side ``a`` or ``b`` of a claim in one seed's results (nan where the table has no number);
    ``b_metric`` names another metric of side b (e.g. lookahead against beam search of one run)."""
    ref = claim[side]
    if isinstance(ref, dict):
        ds = ref.get("dataset", claim.get("dataset", "synthetic"))
        return table_cell(seed["tables"][f"{ds}/{ref['table']}"], ref["row"], ref["column"], f"{ds}_{ref['table']}")
    path = claim.get(f"{side}_metric", claim["metric"])
    value: Any = seed["runs"][ref]
    for key in path.split("."):
        value = value[key]
    return float(value) * (100.0 if path.startswith(PERCENT) else 1.0)


def t_quantile(df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def interval(diffs: list[float]) -> tuple[float, float, float, float]:
    """Mean, standard deviation and the 95% Student-t interval of the paired differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else math.nan
    half = t_quantile(n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    return mean, sd, mean - half, mean + half


def verdict(kind: str, lo: float, hi: float, margin: float = 0.0) -> str:
    floor = -margin if kind == "at_least" else 0.0
    if lo > floor:
        return "holds"
    if hi < floor:
        return "reversed"
    return "unresolved"


def resolve(config: dict[str, Any], per_seed: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for claim in config["claims"]:
        seeds = sorted(per_seed)
        a = [value_of(per_seed[s], claim, "a") for s in seeds]
        b = [value_of(per_seed[s], claim, "b") for s in seeds]
        sign = -1.0 if claim["kind"] == "less" else 1.0
        pairs = [(x, y) for x, y in zip(a, b) if not (math.isnan(x) or math.isnan(y))]
        entry = {**{k: claim[k] for k in ("id", "text", "source", "kind") if k in claim},
                 "margin": float(claim.get("margin", 0.0)), "a": a, "b": b, "seeds": seeds, "n": len(pairs)}
        if len(pairs) < 2:
            entry.update(mean_a=math.nan, mean_b=math.nan, diff=math.nan, sd=math.nan, lo=math.nan, hi=math.nan,
                         verdict="unresolved", why=f"only {len(pairs)} seed(s) with both values")
        else:
            diffs = [sign * (x - y) for x, y in pairs]
            mean, sd, lo, hi = interval(diffs)
            entry.update(mean_a=sum(x for x, _ in pairs) / len(pairs), mean_b=sum(y for _, y in pairs) / len(pairs),
                         diff=mean, sd=sd, lo=lo, hi=hi, verdict=verdict(claim["kind"], lo, hi, entry["margin"]))
            if all(x == y for x, y in pairs):  # e.g. a run whose every epoch lost to its start: its start's weights
                entry["why"] = ("a = b in every seed: both sides read the same value (the same weights), "
                                "so these runs cannot tell the two apart")
        results.append(entry)
    return results


def _f(x: float, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def claim_line(r: dict[str, Any]) -> str:
    op = {"greater": ">", "less": "<", "at_least": "≥"}[r["kind"]]
    margin = f" (margin {r['margin']:g})" if r["kind"] == "at_least" else ""
    return (f"| {r['text']} | {r.get('source', '')} | {_f(r['mean_a'])} {op} {_f(r['mean_b'])}{margin} | "
            f"{_f(r['diff'])} | [{_f(r['lo'])}, {_f(r['hi'])}] | {r['n']} | **{r['verdict']}** |")


HEADER = ["| claim | paper | mean a vs b | paired diff | 95% CI | seeds | verdict |", "|---|---|---|---|---|---|---|"]


def paper_markdown(config: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Paper {config['paper']}: {config['title']}", "",
             f"{meta['n_seeds']} seeds ({', '.join(map(str, meta['seeds']))}), paired within a seed; "
             f"{meta['test_images']} test images; {meta['seconds']} s on {meta['cores']} cores; commit {meta['commit']}, "
             f"{meta['date']}. Config: `{meta['config']}`. The difference is a - b (b - a for '<'); "
             "verdict: the 95% Student-t interval over seeds above 0 (above -margin for '≥'): holds; below: "
             "reversed; else unresolved.", "", *HEADER, *map(claim_line, results), ""]
    for r in results:
        lines.append(f"* {r['text']}: a = {', '.join(_f(x) for x in r['a'])}; b = {', '.join(_f(x) for x in r['b'])}"
                     + (f" ({r['why']})" if r.get("why") else ""))
    notes = config.get("notes", [])
    if notes:
        lines += ["", "Notes:", "", *[f"* {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def commit() -> str:
    """HEAD's short hash, ``-dirty`` when a tracked file differs from it, except what this script
    writes itself (results/claims/, README.md's summary): one paper's run must not mark the next's."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":(exclude)README.md", ":(exclude)results/claims"],
                                 cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    name = head.stdout.strip() or "unknown"
    return f"{name}-dirty" if changed.stdout.strip() else name


def summary_markdown(out_dir: Path) -> str:
    lines = ["| paper | claim | mean a vs b | paired diff | 95% CI | seeds | verdict |",
             "|---|---|---|---|---|---|---|"]
    stamps = []
    for path in sorted(out_dir.glob("[0-9][0-9][0-9].json")):
        data = json.loads(path.read_text())
        stamps.append(f"{data['paper']}: {data['meta']['commit']}, {data['meta']['date']}")
        for r in data["results"]:
            cells = claim_line(r).split(" | ")
            lines.append(f"| {data['paper']} | {cells[0].lstrip('| ')} | " + " | ".join(cells[2:]))
    return "\n".join(lines) + "\n\nMeasured: " + "; ".join(stamps) + ".\n"


def update_readme(summary: str) -> None:
    readme = REPO / "README.md"
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"README.md has no {README_START} ... {README_END} block")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{summary}{README_END}{tail}")


def run_paper(paper: str, args: argparse.Namespace) -> None:
    path = config_path(paper)
    config = load_config(path)
    seeds = config["seeds"][: args.seeds] if args.seeds else config["seeds"]
    if len(seeds) < MIN_SEEDS and not args.seeds:
        raise SystemExit(f"{path}: at least {MIN_SEEDS} seeds")
    started = time.time()
    per_seed = {}
    for seed in seeds:
        per_seed[seed] = run_seed(config, seed, Path(args.workdir) / paper / f"seed{seed}", args.cores)
        print(f"paper {paper}: seed {seed} done in {per_seed[seed]['seconds']} s", flush=True)
    results = resolve(config, per_seed)
    params = seed_params(config, seeds[0])
    meta = {"n_seeds": len(seeds), "seeds": seeds, "seconds": round(time.time() - started), "cores": args.cores,
            "commit": commit(), "date": datetime.date.today().isoformat(), "config": str(path.relative_to(REPO)),
            "test_images": params["synthetic"]["n_test"]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{paper}.json").write_text(json.dumps({"paper": paper, "title": config["title"], "meta": meta,
                                                   "results": results, "per_seed": per_seed}, indent=1))
    (out / f"{paper}.md").write_text(paper_markdown(config, results, meta))
    print(paper_markdown(config, results, meta))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--paper", help="000, 001, 002, 003 or 004")
    which.add_argument("--all", action="store_true")
    parser.add_argument("--seeds", type=int, default=0, help="only the first N seeds of the config (a quick look)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", default="claims", help="per-seed workflows: <workdir>/<paper>/seed<k>/")
    parser.add_argument("--out", default=str(REPO / "results" / "claims"))
    parser.add_argument("--readme", action="store_true", help="copy the summary into README.md")
    args = parser.parse_args()
    papers = sorted(p.name[:3] for p in CONFIGS.glob("[0-9][0-9][0-9]_*.yaml")) if args.all else [args.paper]
    for paper in papers:
        run_paper(paper, args)
    summary = summary_markdown(Path(args.out))
    Path(args.out, "summary.md").write_text(summary)
    if args.readme:
        update_readme(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
