"""Claims configurations (``configs/claims/<paper>_<name>.yaml``) and the params of each seed.

A configuration holds a paper's claims, its seeds (fixed before any run) and ``demo:``, what the
claims need of the built-in sets: which of params.yaml's runs (their values as chosen on
validation, never pinned here), the set sizes, metrics and sweeps. A claim names runs
(``fc-xe``) or table cells, not datasets: under the demo they are the built-in set's; under a
recipe (a real dataset enabled, ``--configfile configs/recipes/<name>.yaml``) the recipe's
values stand as they are, ``demo:`` does not apply, and each claim is bound to the dataset that
builds its runs or tables; a claim the recipe builds nothing for is *outside* it, listed with the
reason, never a verdict (:func:`bind`).

Each seed is the whole workflow again with those params and that seed (data, initialisation,
sampling), as a module of the one DAG (``workflow/rules/claims.smk``); within a seed every
method starts from the same XE run, so the differences are paired. Only :func:`write_seed_params`
writes, and :func:`load_config` reads its file.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from caprl import params as params_mod, run_points
from caprl.claims.verdicts import KINDS, ref_dataset
from caprl.errors import CaprlError
from caprl.workflow.plan import build_plan

MIN_SEEDS = 5  # params.yaml's claims.min_seeds: fewer only where a test says so
WORKSPACE = "claims/{paper}/seed{seed}"  # a seed's data, runs, results and logs (the module's prefix)
PARAMS_FILE = WORKSPACE + "/params.yaml"  # what that seed's stages read (--params)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """:func:`caprl.params.merge` (``--configfile``'s semantics), deep-copied: the result shares no nested
    mapping with ``base`` or ``override``, so a seed's params can be edited in place (``run_overrides``)."""
    return copy.deepcopy(params_mod.merge(base, override))


def config_paths(folder: Path, papers: list[str] | str = "all") -> dict[str, Path]:
    """paper -> its configuration in ``folder`` (one ``<paper>_*.yaml`` each), for ``papers``
    (``all``: every one there)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("[0-9][0-9][0-9]_*.yaml")):
        found.setdefault(path.name[:3], []).append(path)
    wanted = sorted(found) if papers == "all" else list(papers)
    out = {}
    for paper in wanted:
        paths = found.get(paper, [])
        if len(paths) != 1:
            raise CaprlError(f"{folder}: expected one {paper}_*.yaml for claims.papers' {paper!r}, "
                             f"found {[p.name for p in paths]}")
        out[paper] = paths[0]
    return out


def load_config(path: Path, min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """The config, checked: its seeds (at least ``min_seeds`` distinct integers, fixed before the
    run) and every claim's id, text, source, sides and kind (``at_least``: a positive ``margin`` and
    its ``margin_reason``)."""
    config = yaml.safe_load(Path(path).read_text())
    config["file"] = Path(path).name  # what the seeds' MLflow runs are tagged with
    if "params" in config:
        raise CaprlError(f"{path}: params: is demo: since the claims apply to recipes too (it is laid over "
                         "params.yaml on the built-in sets only): rename it")
    for key in ("paper", "title", "seeds", "demo", "claims"):
        if key not in config:
            raise CaprlError(f"{path}: missing key {key!r}")
    seeds = config["seeds"]
    if (not isinstance(seeds, list) or len(seeds) < min_seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise CaprlError(f"{path}: seeds must be at least {min_seeds} distinct integers, got {seeds!r}")
    ids = [claim.get("id") for claim in config["claims"]]
    if len(set(ids)) != len(ids):
        raise CaprlError(f"{path}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    for claim in config["claims"]:
        missing = [k for k in ("id", "text", "source", "a", "b") if not claim.get(k)]
        if missing:
            raise CaprlError(f"{path}: claim {claim.get('id')}: missing {missing}")
        if claim.get("kind") not in KINDS:
            raise CaprlError(f"{path}: claim {claim.get('id')}: kind must be one of {KINDS}")
        if claim["kind"] == "at_least" and not (float(claim.get("margin", 0)) > 0 and claim.get("margin_reason")):
            raise CaprlError(f"{path}: claim {claim['id']}: at_least needs a positive margin and its margin_reason")
        if claim["kind"] != "at_least" and "margin" in claim:
            raise CaprlError(f"{path}: claim {claim['id']}: a margin belongs to at_least claims only")
    return config


def on_builtin_sets(base: dict[str, Any]) -> bool:
    """Whether ``base`` enables only generated datasets (the demo), not a real one (a recipe)."""
    enabled = [spec for spec in base["datasets"].values() if spec.get("enabled", True)]
    return all(spec.get("generate", False) for spec in enabled)


def seed_params(base: dict[str, Any], config: dict[str, Any], seed: int) -> dict[str, Any]:
    """``base`` (params.yaml with any recipe laid over it) for one seed of the config. On the
    built-in sets, the config's ``demo:`` is laid over it: its ``runs:`` replace base's (a list
    names base's runs, their values as they stand; an item ``{name: entry}`` gives a run of the
    config's own), its ``run_overrides:`` then merge into named runs' entries (e.g. another sweep).
    Under a recipe, the recipe's runs and values stand. The seed's MLflow runs go to their own
    experiment, ``<experiment>/claims/<paper>/seed<k>``, tagged with the paper, the configuration's
    file and the seed (``caprl.claims.*``: the MLflow UI finds a claim's runs over its seeds)."""
    base = {k: v for k, v in base.items() if k != "claims"}
    if on_builtin_sets(base):
        params = demo_params(base, config)
    else:
        params = recipe_params(base, config)
    params["tuning"] = {"budget": params["tuning"]["budget"], "runs": {}}  # the claims train no tuning points
    params["seed"] = seed
    params["tracking"] = {**params["tracking"],
                          "experiment": f"{params['tracking']['experiment']}/claims/{config['paper']}/seed{seed}",
                          "tags": {**params["tracking"].get("tags", {}), "caprl.claims.paper": config["paper"],
                                   "caprl.claims.config": config.get("file", config["paper"]), "caprl.claims.seed": seed}}
    return params


def demo_params(base: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    demo = config["demo"]
    params = merge(base, {k: v for k, v in demo.items() if k not in ("runs", "run_overrides")})
    runs = demo.get("runs", list(base["runs"]))
    if isinstance(runs, list):
        unknown = [r for r in runs if isinstance(r, str) and r not in base["runs"]]
        if unknown:
            raise CaprlError(f"claims config {config['paper']}: demo.runs {unknown} are not in params.yaml's runs:")
        entries: dict[str, Any] = {}
        for item in runs:
            if isinstance(item, str):
                entries[item] = base["runs"][item]
            elif isinstance(item, dict):
                entries.update(item)
            else:
                raise CaprlError(f"claims config {config['paper']}: demo.runs: {item!r} is neither a run's name "
                                 "nor {name: entry}")
        runs = entries
    params["runs"] = {run: run_points.named(entry) for run, entry in copy.deepcopy(runs).items()}  # trained
    for run, entry in demo.get("run_overrides", {}).items():
        if run not in params["runs"]:
            raise CaprlError(f"claims config {config['paper']}: demo.run_overrides names {run!r}, not one of its runs")
        params["runs"][run] = merge(params["runs"][run], entry)
    return params


def recipe_params(base: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A recipe's params for its claims: its runs that the claims compare and the runs they start
    from (every run where a claim reads a table: the table's rows are the recipe's choice)."""
    params = copy.deepcopy(base)
    bound = bind(config, params)
    if tables_read(bound):
        return params
    needed: set[str] = set()
    todo = [claim[side].split("/", 1)[1] for claim in bound["claims"] for side in ("a", "b")]
    while todo:
        run = todo.pop()
        if run not in needed:
            needed.add(run)
            todo += [r for r in (params["runs"][run].get("init") or {}).values() if isinstance(r, str)]
    params["runs"] = {run: entry for run, entry in params["runs"].items() if run in needed}
    for spec in params["datasets"].values():
        if "runs" in spec:
            spec["runs"] = [run for run in spec["runs"] if run in needed]
    return params


def bind(config: dict[str, Any], params: dict[str, Any], plan: Any = None) -> dict[str, Any]:
    """The config with each claim bound to what ``params`` (a seed's, resolved or not) build: a run
    side ``<run>`` becomes ``<dataset>/<run>`` (the one dataset that evaluates it), a table side
    gets the one dataset whose tables list it. A claim with a side nothing builds moves to
    ``outside`` (id, text, why): under a recipe, the claims of runs it does not train. ``plan``:
    ``params``' plan where the caller has it (the DAG parses every seed's: one plan each)."""
    plan = plan or build_plan(params)
    runs = {ds: {job.run for job in plan.evaluated(ds)} for ds in plan.datasets}
    tables = {ds: set(plan.tables(ds)) for ds in plan.datasets}
    return bind_to(config, runs, tables)


def bind_to(config: dict[str, Any], runs: dict[str, set[str]], tables: dict[str, set[str]],
            strict: bool = True) -> dict[str, Any]:
    """:func:`bind` on ``runs`` (dataset -> its evaluated runs) and ``tables`` (dataset -> its tables);
    ``strict`` False: no error where none binds (a stored result whose values hold no runs)."""
    bound, outside = [], []
    for claim in config["claims"]:
        claim = copy.deepcopy(claim)
        why = []
        for side in ("a", "b"):
            ref = claim[side]
            if isinstance(ref, dict):
                name, known, where = ref["table"], tables, ref.get("dataset") or claim.get("dataset")
            else:
                where, _, name = ref.rpartition("/")
                known = runs
            found = [ds for ds in known if name in known[ds] and (not where or ds == where)]
            if len(found) > 1:
                raise CaprlError(f"claims config {config['paper']}: claim {claim['id']}: {name} is built on "
                                 f"{found}: name the dataset ({found[0]}/{name})")
            if not found:
                kind = "table" if isinstance(ref, dict) else "run"
                why.append(f"these params build no {kind} {name}" + (f" on {where}" if where else ""))
            elif isinstance(ref, dict):
                claim[side] = {**ref, "dataset": found[0]}
            else:
                claim[side] = f"{found[0]}/{name}"
        if why:
            outside.append({"id": claim["id"], "text": claim["text"], "why": "; ".join(dict.fromkeys(why))})
        else:
            bound.append(claim)
    if not bound and strict:
        raise CaprlError(f"claims config {config['paper']}: these params build none of its claims "
                         f"({outside[0]['why']}, ...): leave the paper out of claims.papers")
    return {**config, "claims": bound, "outside": outside}


def write_seed_params(path: Path, params: dict[str, Any]) -> None:
    """Write a seed's params where its stages read them, atomically, and only if they changed (the
    DAG is parsed on every node of a cluster run: each writes the same text, or nothing)."""
    text = yaml.safe_dump(params, sort_keys=False)
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def tables_read(config: dict[str, Any]) -> set[tuple[str, str]]:
    """(dataset, table) of every table cell a claim reads."""
    out = set()
    for claim in config["claims"]:
        for side in ("a", "b"):
            ref = claim[side]
            if isinstance(ref, dict):
                out.add((ref_dataset(claim, ref), ref["table"]))
    return out
