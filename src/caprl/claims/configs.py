"""Claims configurations (``configs/claims/<paper>_<name>.yaml``) and the params of each seed.

A configuration holds a paper's claims and ``params:``, overrides of the workflow's params (its
``runs:`` replace them) sized to resolve the claims, and the seeds, fixed before any run. Each
seed is the whole workflow again with those params and that seed (data, initialisation,
sampling), as a module of the one DAG (``workflow/rules/claims.smk``); within a seed every
method starts from the same XE run, so the differences are paired. Pure Python: only
:func:`write_seed_params` writes, and :func:`load_config` reads its file.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from caprl.claims.verdicts import KINDS, ref_dataset
from caprl.errors import CaprlError

MIN_SEEDS = 5  # params.yaml's claims.min_seeds: fewer only where a test says so
WORKSPACE = "claims/{paper}/seed{seed}"  # a seed's data, runs, results and logs (the module's prefix)
PARAMS_FILE = WORKSPACE + "/params.yaml"  # what that seed's stages read (--params)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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
    for key in ("paper", "title", "seeds", "params", "claims"):
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


def seed_params(base: dict[str, Any], config: dict[str, Any], seed: int) -> dict[str, Any]:
    """``base`` (params.yaml with any recipe laid over it) with the config's overrides and the seed.
    Its ``runs:`` replace base's: a list names base's runs (their values, chosen on validation, as
    they stand), an item ``{name: entry}`` of it (or a mapping for the whole) gives a run of the
    config's own; ``run_overrides:`` then merges into named runs' entries (e.g. another sweep). The
    seed's MLflow runs go to their own experiment, ``<experiment>/claims/<paper>/seed<k>``."""
    base = {k: v for k, v in base.items() if k != "claims"}
    overrides = {k: v for k, v in config["params"].items() if k not in ("runs", "run_overrides")}
    params = merge(base, overrides)
    runs = config["params"]["runs"]
    if isinstance(runs, list):
        unknown = [r for r in runs if isinstance(r, str) and r not in base["runs"]]
        if unknown:
            raise CaprlError(f"claims config {config['paper']}: runs {unknown} are not in params.yaml's runs:")
        entries: dict[str, Any] = {}
        for item in runs:
            if isinstance(item, str):
                entries[item] = base["runs"][item]
            elif isinstance(item, dict):
                entries.update(item)
            else:
                raise CaprlError(f"claims config {config['paper']}: runs: {item!r} is neither a run's name nor "
                                 "{name: entry}")
        runs = entries
    params["runs"] = copy.deepcopy(runs)
    for run, entry in config["params"].get("run_overrides", {}).items():
        if run not in params["runs"]:
            raise CaprlError(f"claims config {config['paper']}: run_overrides names {run!r}, not one of its runs")
        params["runs"][run] = merge(params["runs"][run], entry)
    params["tuning"] = {"budget": params["tuning"]["budget"], "runs": {}}  # the claims train no tuning points
    params["seed"] = seed
    params["tracking"] = {**params["tracking"],
                          "experiment": f"{params['tracking']['experiment']}/claims/{config['paper']}/seed{seed}"}
    return params


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
