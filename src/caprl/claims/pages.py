"""A paper's verdicts from its seeds' workspaces (``caprl claims``, the rule
``claims_<paper>_verdicts``), and again from stored values (``--render-only``, ``--reread``).

Writes the paper's json (every seed's values, params file and validation numbers; the commit each
score was made at), its page and its forest plot beside it: ``claims/<paper>/verdicts.{json,md,png}``
in the DAG, which ``caprl claims-summary --publish`` copies to ``results/claims/<paper>.{json,md,png}``. A
verdict uses every seed of the config: a seed without a value leaves the claim unresolved, the seed
named (:func:`caprl.claims.verdicts.resolve`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import subprocess
from pathlib import Path
from typing import Any

from caprl import io
from caprl import params as params_mod
from caprl.claims.aggregate import aggregate_markdown, aggregate_png, paper_aggregate
from caprl.claims.collect import collect_seed
from caprl.claims.configs import MIN_SEEDS, WORKSPACE, bind, bind_to, load_config
from caprl.claims.forest import forest_png
from caprl.claims.seed_tables import tables_markdown
from caprl.claims.verdicts import decide, holm, paper_markdown, resolve
from caprl.errors import CaprlError

CODE_PATHS = ["src", "workflow", "Snakefile", "params.yaml", "configs", "pyproject.toml"]  # what builds a score


def commit(repo: Path = Path(".")) -> str:
    """HEAD's short hash, ``-dirty`` when a tracked file differs from it, except what the claims
    write themselves (results/claims/, README.md's summary): one paper's run must not mark the next's."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":(exclude)README.md", ":(exclude)results/claims"],
                                 cwd=repo, capture_output=True, text=True)
    except OSError:
        return "unknown"
    name = head.stdout.strip() or "unknown"
    return f"{name}-dirty" if changed.stdout.strip() else name


def made_at(per_seed: dict[Any, dict[str, Any]]) -> list[str]:
    """The commits the seeds' score files were made at (their ``provenance``), short, sorted."""
    return sorted({str(scores.get("provenance", {}).get("git_commit") or "unknown")[:7]
                   for seed in per_seed.values() for scores in seed.get("runs", {}).values()})


def other_code(commits: list[str], head: str, repo: Path = Path(".")) -> list[str]:
    """The commits among ``commits`` whose code (``CODE_PATHS``) differs from ``head``'s (a score
    kept from earlier code: Snakemake re-runs a job for changed params, not for changed code)."""
    head = head.removesuffix("-dirty")
    differ = []
    for c in commits:
        same = subprocess.run(["git", "diff", "--quiet", c, head, "--", *CODE_PATHS], cwd=repo, capture_output=True)
        if same.returncode != 0:
            differ.append(c)
    return differ


def test_images(per_seed: dict[Any, dict[str, Any]]) -> str:
    """How many test images the seeds' runs were scored on (``a-b`` where they differ)."""
    counts = sorted({int(scores["n_images"]) for seed in per_seed.values() for scores in seed["runs"].values()
                     if "n_images" in scores})
    return "?" if not counts else f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}-{counts[-1]:,}"


def stored_binding(config: dict[str, Any], per_seed: dict[Any, dict[str, Any]], strict: bool = True) -> dict[str, Any]:
    """:func:`caprl.claims.configs.bind` on what a stored run's seeds hold (its runs' and tables' keys)."""
    runs: dict[str, set[str]] = {}
    tables: dict[str, set[str]] = {}
    for values in per_seed.values():
        for key in values.get("runs", {}):
            ds, run = key.split("/", 1)
            runs.setdefault(ds, set()).add(run)
        for key in values.get("tables", {}):
            ds, table = key.split("/", 1)
            tables.setdefault(ds, set()).add(table)
    return bind_to(config, runs, tables, strict)


def tables_path(json_path: Path) -> Path:
    """Where a paper's tables over its seeds go beside its json: ``<stem>_tables.md``."""
    return json_path.with_name(f"{json_path.stem}_tables.md")


def write_paper(json_path: Path, config: dict[str, Any], results: list[dict[str, Any]],
                meta: dict[str, Any], per_seed: dict[Any, dict[str, Any]]) -> str:
    """The paper's json (``json_path``), its page, its forest plot, its tables over the seeds and its
    rliable aggregate's figure beside it (``.md``, ``.png``, ``_tables.md``, ``_aggregate.png``); the
    page's text."""
    aggregate = paper_aggregate(config, per_seed, int(config["seeds"][0]))
    page = paper_markdown(config, results, meta) + aggregate_markdown(aggregate)
    forest_png(config, results, json_path.with_suffix(".png"))
    aggregate_png(aggregate, f"Paper {config['paper']}", json_path.with_name(f"{json_path.stem}_aggregate.png"))
    io.write_text(tables_path(json_path), f"# Paper {config['paper']}: its tables over the claims' seeds\n\n"
                  + (tables_markdown(per_seed, list(config["seeds"])) or "Its claims build no table.\n"))
    io.write_json(json_path, {"paper": config["paper"], "title": config["title"], "meta": meta,
                              "results": results, "outside": config.get("outside", []), "aggregate": aggregate,
                              "per_seed": per_seed})
    io.write_text(json_path.with_suffix(".md"), page)
    return page


def verdicts(config_path: Path, root: Path, out: Path, target: str, min_seeds: int = MIN_SEEDS) -> str:
    """The paper's verdicts from every seed's workspace under ``root`` (``claims/<paper>/seed<k>``):
    each seed's values read with the params its stages read (its ``params.yaml``, recorded with its
    SHA-256), the claims resolved over every seed of the config."""
    config = load_config(config_path, min_seeds)
    paper = config["paper"]
    first = params_mod.load([str(root / WORKSPACE.format(paper=paper, seed=config["seeds"][0]) / "params.yaml")])
    config = bind(config, first)
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in config["seeds"]:
        workspace = root / WORKSPACE.format(paper=paper, seed=seed)
        params_file = workspace / "params.yaml"
        params = params_mod.load([str(params_file)])
        if params["seed"] != seed:
            raise CaprlError(f"{params_file}: seed {params['seed']}, but it is the folder of seed {seed} of "
                             f"{config_path}: remove the folder and run the claims target again")
        per_seed[seed] = collect_seed(params, config, workspace)
        per_seed[seed]["params_file"] = str(params_file)
        per_seed[seed]["params_sha256"] = hashlib.sha256(params_file.read_bytes()).hexdigest()
    meta: dict[str, Any] = {
        "n_seeds": len(config["seeds"]), "seeds": config["seeds"], "seeds_run": config["seeds"],
        "commit": commit(), "date": datetime.date.today().isoformat(), "config": str(config_path),
        "test_images": test_images(per_seed), "made_at": made_at(per_seed),
        "dag": {"target": target, "train_seconds": round(sum(s["train_seconds"] for s in per_seed.values()), 2)},
    }
    meta["other_code"] = other_code(meta["made_at"], meta["commit"])
    return write_paper(out, config, resolve(config, per_seed), meta, per_seed)


def reread(config_path: Path, out: Path, min_seeds: int = MIN_SEEDS) -> str:
    """The paper's verdicts again from the per-seed values its last run stored (``out``, its json),
    under today's config and rules, without training: the runs' scores keep the commit they were
    measured at, and the page says so."""
    config = load_config(config_path, min_seeds)
    stored = io.read_json(out, "a paper's claims results")
    per_seed = {int(seed): values for seed, values in stored["per_seed"].items()}
    for values in per_seed.values():
        if "validation" not in values:  # stored before operating points were chosen on validation
            values["tables"] = {}
            values["tables_reason"] = ("its tables' operating points were read off the test curves (stored at "
                                       f"{stored['meta']['commit']}, before they were chosen on validation): re-run")
    config = stored_binding(config, per_seed)
    meta = dict(stored["meta"])
    meta.update(n_seeds=len(config["seeds"]), seeds=config["seeds"], config=str(config_path))
    meta["reread"] = {"commit": commit(), "date": datetime.date.today().isoformat(),
                      "note": f"the scores were measured at {stored['meta']['commit']} ({stored['meta']['date']}); "
                              f"the verdicts were re-read at {commit()} under this config and its rules"}
    return write_paper(out, config, resolve(config, per_seed), meta, per_seed)


def render(config_path: Path, out: Path, min_seeds: int = MIN_SEEDS) -> str:
    """The paper's page and its json's verdicts again from each claim's per-seed values its last run
    stored, under today's verdict rules (the interval, the p, Holm): no training and no re-reading of
    the scores. The config must still state the stored claims (else ``reread``)."""
    config = load_config(config_path, min_seeds)
    stored = io.read_json(out, "a paper's claims results")
    outside = {c["id"] for c in stored.get("outside", [])}
    bound = {c["id"]: c for c in stored_binding(config, stored["per_seed"], strict=False)["claims"]}
    config = {**config, "claims": [bound.get(c["id"], c) for c in config["claims"] if c["id"] not in outside],
              "outside": stored.get("outside", [])}
    if [c["id"] for c in config["claims"]] != [r["id"] for r in stored["results"]]:
        raise CaprlError(f"{config_path}: its claims are not the ones {out} stored: --reread reads them again")
    results = holm([decide(r) for r in stored["results"]])
    meta = {**stored["meta"], "rendered": {"commit": commit(), "date": datetime.date.today().isoformat()}}
    return write_paper(out, config, results, meta, stored["per_seed"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="the paper's claims configuration")
    parser.add_argument("--root", default=Path("."), type=Path,
                        help="where the seeds' workspaces are (claims/<paper>/seed<k>/ under it)")
    parser.add_argument("--out", required=True, type=Path,
                        help="the paper's json (its page beside it, .md): claims/<paper>/verdicts.json from the DAG, "
                             "results/claims/<paper>.json to render or re-read what was published")
    parser.add_argument("--target", default=None, help="the DAG target that built the scores (recorded)")
    parser.add_argument("--min-seeds", type=int, default=MIN_SEEDS)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--reread", action="store_true",
                      help="no training: the verdicts again from the per-seed values <out>/<paper>.json stored")
    mode.add_argument("--render-only", action="store_true",
                      help="no training, no re-reading: the verdicts and page again from each claim's stored values")


def main(args: argparse.Namespace) -> None:
    if args.reread:
        reread(args.config, args.out, args.min_seeds)
    elif args.render_only:
        render(args.config, args.out, args.min_seeds)
    else:
        verdicts(args.config, args.root, args.out, args.target or "claims", args.min_seeds)

