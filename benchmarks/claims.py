"""Every paper's claims, resolved: paired seeds, a 95% interval of each difference, a verdict.

    python benchmarks/claims.py --paper 001            # one paper: configs/claims/001_*.yaml
    python benchmarks/claims.py --all --readme         # every paper, then README.md's summary

A claims configuration (``configs/claims/<paper>_<name>.yaml``) holds the paper's claims and
``params:``, overrides of params.yaml (its ``runs:`` replace params.yaml's) sized to resolve
them: at least 5 seeds and 1,000 test images, the values of params.yaml (chosen on validation by
``snakemake tuning``) unless the config says otherwise. The seeds are the config's, fixed before
the run: a verdict uses every one of them. For each seed, params.yaml with the overrides and that
seed (data, initialisation, sampling: everything) is written to ``<workdir>/<paper>/seed<k>/``
and the real workflow (``snakemake``) builds every evaluated run's test scores (and what the
tables the claims read need); within a seed all methods start from the same XE run, so
differences are paired. A claim compares two values of every seed:

* ``a``/``b``: ``<dataset>/<run>`` with ``metric`` (a path into its score file:
  ``metrics.CIDEr-D``, ``diversity.rs.Div-2``, ``lookahead.metrics.CIDEr-D``, ``retrieval.R@10``;
  ``b_metric``: another path for side b, e.g. one run's lookahead against its beam search),
  or ``{table: <table>, row: <row label>, column: <column>}`` (a cell of the dataset's table,
  e.g. paper 004's recall at a matched CIDEr-D; ``scale: 100`` prints a fraction in %);
* ``kind``: ``greater`` (a > b), ``less`` (a < b), ``at_least`` (a >= b - ``margin``; only where
  the paper says "comparable" / "not worse", with ``margin_reason``);
* ``source``: the paper's sentence or table cell the claim states.

The tables a claim reads are built here, for each seed, by the pipeline's own table code from the
seed's score files, as ``caprl tables`` builds them: each score file carries its run's *validation*
numbers (``caprl evaluate`` writes them from the checkpoint it evaluates: the val metrics of the
epoch that checkpoint holds, :mod:`caprl.evaluation.validation`), so an ``auto`` operating point
(paper 004's matched CIDEr-D or R@5) is chosen on the validation curves, and each method's test
numbers are read where its validation curve reaches it
(``caprl.tables.operating.read_curve``: the runs bracketing it on validation, their test numbers
mixed in the same proportion). A validation curve that does not reach it leaves its cell empty.

Verdicts. The difference d = a - b (b - a for ``less``) of each seed gives the mean and the 95%
Student-t interval over the config's seeds. ``greater`` / ``less``: **holds** if the interval lies
above 0, **reversed** if below 0; ``at_least``: **holds** if it lies above -margin (a is not worse
than b by the margin or more), **reversed** if below -margin; else **unresolved**. A claim is
**unresolved**, with no interval, where any seed of the config has no value on either side (a run
without scores, a metric missing, an empty table cell, e.g. a curve that does not reach the
operating point): the reason names the seed; never a verdict on the other seeds. Language metrics
are in % (as the papers print them), diversity ratios and recalls as written. Many comparisons: each
claim also gets the p of the paired t-test its interval inverts and a Holm-Bonferroni verdict over
its paper's claims (one family per paper; ``claim_verdicts.holm``), and the summary counts the
verdicts both ways. ``--render-only`` writes the pages, jsons and summary again from the values the
jsons hold, under today's verdict rules, without training (``--reread`` reads the stored scores
again under today's config).

Writes ``results/claims/<paper>.md`` and ``.json`` (every seed's values, validation numbers and
tables) and ``results/claims/summary.md`` (every paper's claims found there); ``--readme`` copies
the summary, with the commit and date, between the claims markers of README.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by path (tests)
from claim_verdicts import (  # Missing, interval, value_of, verdict: for the tests (claims.<name>)
    KINDS,
    Missing,  # noqa: F401
    claim_line,  # noqa: F401
    decide,
    holm,
    interval,  # noqa: F401
    paper_markdown,
    ref_dataset,
    resolve,
    summary_markdown,
    value_of,  # noqa: F401
    verdict,  # noqa: F401
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "claims"
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
    """The config, checked: its seeds (at least MIN_SEEDS distinct integers, fixed before the run)
    and every claim's id, text, source, sides and kind (``at_least``: a positive ``margin`` and its
    ``margin_reason``)."""
    config = yaml.safe_load(path.read_text())
    for key in ("paper", "title", "seeds", "params", "claims"):
        if key not in config:
            raise SystemExit(f"{path}: missing key {key!r}")
    seeds = config["seeds"]
    if (not isinstance(seeds, list) or len(seeds) < MIN_SEEDS or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise SystemExit(f"{path}: seeds must be at least {MIN_SEEDS} distinct integers, got {seeds!r}")
    ids = [claim.get("id") for claim in config["claims"]]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    for claim in config["claims"]:
        missing = [k for k in ("id", "text", "source", "a", "b") if not claim.get(k)]
        if missing:
            raise SystemExit(f"{path}: claim {claim.get('id')}: missing {missing}")
        if claim.get("kind") not in KINDS:
            raise SystemExit(f"{path}: claim {claim.get('id')}: kind must be one of {KINDS}")
        if claim["kind"] == "at_least" and not (float(claim.get("margin", 0)) > 0 and claim.get("margin_reason")):
            raise SystemExit(f"{path}: claim {claim['id']}: at_least needs a positive margin and its margin_reason")
        if claim["kind"] != "at_least" and "margin" in claim:
            raise SystemExit(f"{path}: claim {claim['id']}: a margin belongs to at_least claims only")
    return config


def seed_params(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """params.yaml with the config's overrides and the seed. Its ``runs:`` replace params.yaml's: a
    list names params.yaml's runs (their values, chosen on validation, as they stand), an item
    ``{name: entry}`` of it (or a mapping for the whole) gives a run of the config's own;
    ``run_overrides:`` then merges into named runs' entries (e.g. another sweep)."""
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    overrides = {k: v for k, v in config["params"].items() if k not in ("runs", "run_overrides")}
    params = merge(base, overrides)
    runs = config["params"]["runs"]
    if isinstance(runs, list):
        named = [r for r in runs if isinstance(r, str)]
        unknown = [r for r in named if r not in base["runs"]]
        if unknown:
            raise SystemExit(f"claims config: runs {unknown} are not in params.yaml's runs:")
        entries: dict[str, Any] = {}
        for item in runs:
            if isinstance(item, str):
                entries[item] = base["runs"][item]
            elif isinstance(item, dict):
                entries.update(item)
            else:
                raise SystemExit(f"claims config: runs: {item!r} is neither a run's name nor {{name: entry}}")
        runs = entries
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
                out.add((ref_dataset(claim, ref), ref["table"]))
    return out


def validation_numbers(workdir: Path, reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``<dataset>/<run>`` -> the val numbers its score file (``reports``, by the same key) carries:
    the record of the epoch its evaluated checkpoint holds, read by the function the tables read them
    with (:func:`caprl.evaluation.validation.numbers`). A score file without them (evaluated before
    ``caprl evaluate`` recorded them) is an error naming it: its tables' operating points would be
    chosen on the test curves."""
    from caprl.evaluation import validation
    from caprl.workflow.plan import SCORES

    out: dict[str, dict[str, float]] = {}
    for key, report in reports.items():
        dataset, run = key.split("/", 1)
        path = workdir / SCORES.format(dataset=dataset, run=run)
        if validation.SECTION not in report:
            raise SystemExit(f"{path}: no validation numbers (evaluated before caprl evaluate recorded its "
                             "checkpoint's): delete it, and the workflow evaluates the run again")
        out[key] = validation.numbers(report, str(path))
    return out


def seed_tables(params: dict[str, Any], workdir: Path, tables: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """``<dataset>/<table>`` -> {csv, title, notes}: each table built by the pipeline's own code
    (``caprl tables``) from the seed's score and retrieval files (their validation numbers: auto
    operating points chosen on validation, read on test); also written to ``<workdir>/claims_tables/``."""
    from caprl import params as params_mod
    from caprl.tables.build import FORMATS, build_tables, load_scores
    from caprl.tables.runs import dataset_runs, gold_retrieval_runs
    from caprl.workflow.plan import RESULTS

    expanded = params_mod.resolve(copy.deepcopy(params))
    out: dict[str, dict[str, Any]] = {}
    folder = workdir / "claims_tables"
    folder.mkdir(parents=True, exist_ok=True)
    for ds, name in tables:
        runs = [view.name for view in dataset_runs(expanded, ds)]
        gold = [view.name for view in gold_retrieval_runs(expanded, ds)]
        scores = load_scores(workdir / RESULTS.format(dataset=ds), runs, ds, gold)
        table = build_tables(expanded, ds, scores, [name])[name]
        for ext, render in FORMATS.items():
            (folder / f"{ds}_{name}.{ext}").write_text(render(table))
        out[f"{ds}/{name}"] = {"csv": FORMATS["csv"](table), "title": table.title, "notes": list(table.notes)}
    return out


def run_seed(config: dict[str, Any], seed: int, workdir: Path, cores: int) -> dict[str, Any]:
    """Build the seed's scores (and what the tables the claims read need) with the real workflow;
    collect them, every evaluated run's validation numbers, and those tables (built here, their
    operating points chosen on validation)."""
    from caprl.workflow.plan import RETRIEVAL, SCORES, build_plan

    workdir = workdir.resolve()  # snakemake runs in it (cwd) and is told it (--directory): one absolute path
    workdir.mkdir(parents=True, exist_ok=True)
    params = seed_params(config, seed)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    plan = build_plan(params)
    jobs = [job for ds in plan.datasets for job in plan.evaluated(ds)]
    tables = sorted(tables_read(config))
    targets = [job.result(SCORES) for job in jobs] + [job.result(RETRIEVAL) for job in jobs if job.retrieval]
    for ds in sorted({ds for ds, _ in tables}):
        targets += [t for t in plan.table_inputs(ds) if t not in targets]  # the gold-caption recalls too
    env = {**os.environ, "CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    started = time.time()
    with open(workdir / "snakemake.log", "a", encoding="utf-8") as log:
        done = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores",
                               str(cores), "--keep-going", *targets], env=env, cwd=workdir, stdout=log, stderr=log)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: the workflow failed; see {workdir / 'snakemake.log'} and {workdir / 'logs'}")
    out: dict[str, Any] = {"seconds": round(time.time() - started), "runs": {}, "validation": {}, "tables": {},
                           "table_notes": {}}
    for job in jobs:
        scores = json.loads((workdir / job.result(SCORES)).read_text())
        if job.retrieval:
            retrieval = json.loads((workdir / job.result(RETRIEVAL)).read_text())
            scores["retrieval"] = {k: v for k, v in retrieval.items() if k != "ranks"}
        out["runs"][f"{job.dataset}/{job.run}"] = scores
    out["validation"] = validation_numbers(workdir, out["runs"])
    if tables:
        for key, built in seed_tables(params, workdir, tables).items():
            out["tables"][key] = built["csv"]
            out["table_notes"][key] = [built["title"], *built["notes"]]
    return out


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


CODE_PATHS = ["src", "workflow", "Snakefile", "params.yaml", "configs", "pyproject.toml"]  # what builds a score


def made_at(per_seed: dict[Any, dict[str, Any]]) -> list[str]:
    """The commits the seeds' score files were made at (their ``provenance``), short, sorted."""
    return sorted({str(scores.get("provenance", {}).get("git_commit") or "unknown")[:7]
                   for seed in per_seed.values() for scores in seed.get("runs", {}).values()})


def other_code(commits: list[str], head: str) -> list[str]:
    """The commits among ``commits`` whose code (``CODE_PATHS``) differs from ``head``'s: a seed
    folder kept from an earlier run holds runs that the workflow does not re-train when only the
    code changed, so their scores are of that code, whatever commit the claims run is labelled with."""
    head = head.removesuffix("-dirty")
    differ = []
    for c in commits:
        same = subprocess.run(["git", "diff", "--quiet", c, head, "--", *CODE_PATHS], cwd=REPO, capture_output=True)
        if same.returncode != 0:
            differ.append(c)
    return differ


def update_readme(summary: str) -> None:
    readme = REPO / "README.md"
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"README.md has no {README_START} ... {README_END} block")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{summary}{README_END}{tail}")


def run_seeds(config: dict[str, Any], seeds: list[int], workdir: Path, cores: int, at_once: int,
              done: Callable[[int, dict[str, Any]], None] = lambda seed, out: None) -> dict[int, dict[str, Any]]:
    """Every seed's :func:`run_seed`, ``at_once`` of them at a time (each its own snakemake on the
    same ``cores``: a job is one thread, so two seeds keep both cores busy where one seed's DAG
    narrows to a single long run, as paper 001's equal-budget PG-SPIDEr). The seeds' workflows
    share nothing but the machine, so their scores do not depend on ``at_once``; the first seed
    that fails stops the others from starting and is raised. Returned in the config's seed order."""
    if at_once < 1:
        raise SystemExit(f"--seed-jobs: expected at least 1 seed at a time, got {at_once}")
    results: dict[int, dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {pool.submit(run_seed, config, seed, workdir / f"seed{seed}", cores): seed for seed in seeds}
        try:
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
                done(futures[future], results[futures[future]])
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return {seed: results[seed] for seed in seeds}


def run_paper(paper: str, args: argparse.Namespace) -> None:
    path = config_path(paper)
    config = load_config(path)
    seeds = config["seeds"][: args.seeds] if args.seeds else config["seeds"]
    started = time.time()
    per_seed = run_seeds(config, seeds, Path(args.workdir) / paper, args.cores, args.seed_jobs,
                         lambda seed, out: print(f"paper {paper}: seed {seed} done in {out['seconds']} s", flush=True))
    results = resolve(config, per_seed)  # every seed of the config: a seed not run leaves each claim unresolved
    params = seed_params(config, seeds[0])
    meta = {"n_seeds": len(config["seeds"]), "seeds": config["seeds"], "seeds_run": seeds,
            "seconds": round(time.time() - started), "cores": args.cores, "seed_jobs": args.seed_jobs,
            "commit": commit(),
            "date": datetime.date.today().isoformat(), "config": str(path.relative_to(REPO)),
            "test_images": params["synthetic"]["n_test"], "made_at": made_at(per_seed)}
    meta["other_code"] = other_code(meta["made_at"], meta["commit"])
    if meta["other_code"]:
        print(f"paper {paper}: scores made by other code ({', '.join(meta['other_code'])}) than {meta['commit']}'s: "
              f"{Path(args.workdir) / paper} held runs of an earlier commit; a fresh --workdir re-trains them",
              file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{paper}.json").write_text(json.dumps({"paper": paper, "title": config["title"], "meta": meta,
                                                   "results": results, "per_seed": per_seed}, indent=1))
    (out / f"{paper}.md").write_text(paper_markdown(config, results, meta))
    print(paper_markdown(config, results, meta))


def reread_paper(paper: str, args: argparse.Namespace) -> None:
    """The paper's verdicts again from the per-seed values its last run stored (``<out>/<paper>.json``),
    under today's config and rules, without training: the runs' scores keep the commit they were
    measured at, and the page says so. A claim whose runs that run did not train is unresolved."""
    path = config_path(paper)
    config = load_config(path)
    out = Path(args.out)
    stored = json.loads((out / f"{paper}.json").read_text())
    per_seed = {int(seed): values for seed, values in stored["per_seed"].items()}
    for values in per_seed.values():
        if "validation" not in values:  # stored before operating points were chosen on validation
            values["tables"] = {}
            values["tables_reason"] = ("its tables' operating points were read off the test curves (stored at "
                                       f"{stored['meta']['commit']}, before they were chosen on validation): re-run")
    meta = dict(stored["meta"])
    meta.update(n_seeds=len(config["seeds"]), seeds=config["seeds"], config=str(path.relative_to(REPO)))
    meta["reread"] = {"commit": commit(), "date": datetime.date.today().isoformat(),
                      "note": f"the scores were measured at {stored['meta']['commit']} ({stored['meta']['date']}); "
                              f"the verdicts were re-read at {commit()} under this config and its rules"}
    results = resolve(config, per_seed)
    (out / f"{paper}.json").write_text(json.dumps({"paper": paper, "title": config["title"], "meta": meta,
                                                   "results": results, "per_seed": per_seed}, indent=1))
    (out / f"{paper}.md").write_text(paper_markdown(config, results, meta))
    print(paper_markdown(config, results, meta))


def render_paper(paper: str, args: argparse.Namespace) -> None:
    """The paper's page and its json's verdicts again from each claim's per-seed values its last run
    stored (``<out>/<paper>.json``'s ``results``), under today's verdict rules (the interval, the p,
    Holm): no training and no re-reading of the scores, so every value stays as measured; the page
    says when it was rendered. The config must still state the stored claims (else ``--reread``)."""
    path = config_path(paper)
    config = load_config(path)
    out = Path(args.out)
    stored = json.loads((out / f"{paper}.json").read_text())
    if [c["id"] for c in config["claims"]] != [r["id"] for r in stored["results"]]:
        raise SystemExit(f"{path}: its claims are not the ones {out / paper}.json stored: --reread reads them again")
    results = holm([decide(r) for r in stored["results"]])
    meta = {**stored["meta"], "rendered": {"commit": commit(), "date": datetime.date.today().isoformat()}}
    (out / f"{paper}.json").write_text(json.dumps({**stored, "meta": meta, "results": results}, indent=1))
    (out / f"{paper}.md").write_text(paper_markdown(config, results, meta))
    print(paper_markdown(config, results, meta))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--paper", help="000, 001, 002, 003 or 004")
    which.add_argument("--all", action="store_true")
    parser.add_argument("--seeds", type=int, default=0,
                        help="run only the first N seeds of the config (a quick look: a verdict needs every seed "
                             "of the config, so every claim is then unresolved, the seeds not run named)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seed-jobs", type=int, default=1,
                        help="seeds run at once, each a snakemake on --cores (default 1: one after another)")
    parser.add_argument("--workdir", default="claims", help="per-seed workflows: <workdir>/<paper>/seed<k>/")
    parser.add_argument("--out", default=str(REPO / "results" / "claims"))
    parser.add_argument("--readme", action="store_true", help="copy the summary into README.md")
    parser.add_argument("--reread", action="store_true",
                        help="no training: the verdicts again from the per-seed values <out>/<paper>.json stored")
    parser.add_argument("--render-only", action="store_true",
                        help="no training, no re-reading: the verdicts and pages again from each claim's per-seed "
                             "values <out>/<paper>.json stored")
    args = parser.parse_args()
    if args.reread and args.render_only:
        parser.error("--reread and --render-only: one or the other")
    papers = sorted(p.name[:3] for p in CONFIGS.glob("[0-9][0-9][0-9]_*.yaml")) if args.all else [args.paper]
    for paper in papers:
        (reread_paper if args.reread else render_paper if args.render_only else run_paper)(paper, args)
    summary = summary_markdown(Path(args.out))
    Path(args.out, "summary.md").write_text(summary)
    if args.readme:
        update_readme(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
