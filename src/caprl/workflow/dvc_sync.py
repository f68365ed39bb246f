"""One cache of results for DVC and Snakemake: ``caprl dvc-lock`` and the Snakefile's sync.

The two tools judge "up to date" differently: DVC by content hashes in ``dvc.lock``,
Snakemake by modification times (outputs newer than inputs) and its own metadata. Files
that DVC writes (``dvc pull``, ``dvc checkout``, ``dvc commit``) get their mtimes in no
particular order, so Snakemake would re-run everything after a collaborator's ``git clone``
+ ``dvc pull``, training included. Two steps keep them in agreement:

* ``caprl dvc-lock`` (after ``snakemake ... all_tables``): records every stage whose outputs
  exist in ``dvc.lock`` and DVC's cache (``dvc commit``), so ``dvc status`` tells the truth
  and ``dvc push`` can share the results;
* :func:`sync_after_dvc` (the Snakefile calls it at start): when ``dvc.lock`` changed since
  the last sync, the outputs of every stage DVC reports unchanged get mtimes in the order of
  the DAG (each stage's newer than its inputs'), so Snakemake re-runs nothing DVC vouches
  for. Stages DVC reports changed are left alone for Snakemake to judge.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from caprl.errors import CaprlError

log = logging.getLogger(__name__)
MARKER = Path(".snakemake") / "caprl-dvc-lock.sha256"  # the dvc.lock last synced


def _paths(entries: list[Any]) -> list[str]:
    """dvc.yaml ``deps``/``outs``/``metrics``/``plots`` entries (a path, or ``{path: options}``) -> paths."""
    return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]


def load_stages(dvc_yaml: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Stage name -> (deps, outs) of dvc.yaml."""
    stages = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})
    return {name: (_paths(s.get("deps", [])),
                   _paths(s.get("outs", [])) + _paths(s.get("metrics", [])) + _paths(s.get("plots", [])))
            for name, s in stages.items()}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def levels(stages: dict[str, tuple[list[str], list[str]]]) -> dict[str, int]:
    """Stage -> its depth in the DAG (0: reads no other stage's output)."""
    producers = {out: name for name, (_, outs) in stages.items() for out in outs}
    depth: dict[str, int] = {}

    def visit(name: str, seen: tuple[str, ...] = ()) -> int:
        if name in depth:
            return depth[name]
        if name in seen:
            raise CaprlError(f"dvc.yaml: stages form a cycle: {' -> '.join(seen + (name,))}")
        parents = {producers[o] for dep in stages[name][0] for o in producers if _inside(dep, o) or _inside(o, dep)}
        depth[name] = 1 + max((visit(p, seen + (name,)) for p in parents - {name}), default=-1)
        return depth[name]

    for name in stages:
        visit(name)
    return depth


def changed_stages(workdir: Path) -> set[str]:
    """The stages ``dvc status`` reports changed (deps, outs, params or command)."""
    proc = subprocess.run(["dvc", "status", "--json"], cwd=workdir, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise CaprlError(f"`dvc status` failed in {workdir}: {proc.stderr.strip()[-500:]}")
    return {name.split(":")[-1] for name in json.loads(proc.stdout or "{}")}


def _touch(path: Path, when: float) -> None:
    if path.is_dir():
        for sub in sorted(path.rglob("*"), reverse=True):  # contents first, the folder last
            os.utime(sub, (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def order_mtimes(workdir: Path, skip: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    """Give the outputs of every stage not in ``skip`` whose outputs all exist mtimes in DAG order;
    the number of stages ordered."""
    stages = load_stages(workdir / "dvc.yaml")
    depth = levels(stages)
    start = time.time() - max(depth.values(), default=0) - 2
    ordered = 0
    for name, (_, outs) in stages.items():
        paths = [workdir / out for out in outs]
        if name in skip or not paths or not all(p.exists() for p in paths):
            continue
        for path in paths:
            _touch(path, start + depth[name])
        ordered += 1
    return ordered


def lock_digest(workdir: Path) -> str | None:
    lock = workdir / "dvc.lock"
    return hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else None


def sync_after_dvc(workdir: str | os.PathLike[str] = ".") -> None:
    """Order output mtimes as the DAG after DVC wrote files; a no-op (no DVC call) unless dvc.lock
    changed since the last sync. Never fails the workflow: a DVC error is logged and skipped."""
    root = Path(workdir)
    digest = lock_digest(root)
    marker = root / MARKER
    if digest is None or (marker.exists() and marker.read_text().strip() == digest):
        return
    try:
        changed = changed_stages(root)
        n = order_mtimes(root, skip=changed)
    except (CaprlError, OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("could not line up DVC's files with Snakemake (%s); Snakemake judges them by mtime", exc)
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(digest)
    log.info("dvc.lock changed: outputs of %d stage(s) DVC reports up to date are marked so for Snakemake%s", n,
             f"; {len(changed)} changed stage(s) left to Snakemake" if changed else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dvc-yaml", default="dvc.yaml", help="the pipeline file (default: dvc.yaml)")


def main(args: argparse.Namespace) -> None:
    """``caprl dvc-lock``: record what Snakemake built in dvc.lock and DVC's cache."""
    root = Path(args.dvc_yaml).resolve().parent
    stages = load_stages(Path(args.dvc_yaml))
    done = [name for name, (_, outs) in stages.items() if outs and all((root / o).exists() for o in outs)]
    missing = sorted(set(stages) - set(done))
    if not done:
        raise CaprlError(f"no stage of {args.dvc_yaml} has its outputs: run `snakemake --cores N all_tables` first")
    # every stage at once is ~10x faster than naming them; name them only when some have no outputs
    targets = done if missing else []
    proc = subprocess.run(["dvc", "commit", "--force", "--quiet", *targets], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CaprlError(f"`dvc commit` failed: {proc.stderr.strip()[-1000:]}")
    order_mtimes(root, skip=set(missing))
    digest = lock_digest(root)
    if digest:
        (root / MARKER).parent.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text(digest)
    log.info("dvc.lock records %d stage(s)%s; `dvc status` now compares against them, `dvc push` shares them",
             len(done), f" ({len(missing)} without outputs left out: {', '.join(missing[:5])}...)" if missing else "")
