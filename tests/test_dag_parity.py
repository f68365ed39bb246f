"""Snakemake and DVC run the same set of `caprl` commands (same stages, same arguments)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from conftest import REPO


def normalise(cmd: str) -> str:
    return re.sub(r"\s+", " ", cmd).strip()


def snakemake_commands(workdir: Path) -> set[str]:
    proc = subprocess.run(["snakemake", "-n", "-p", "--forceall", "--cores", "1", "all_tables"],
                          capture_output=True, text=True, cwd=workdir, check=True)
    lines = (line.strip().removeprefix("Shell command:").strip() for line in (proc.stdout + proc.stderr).splitlines())
    return {normalise(line) for line in lines if line.startswith("caprl ")}


def dvc_commands(workdir: Path) -> set[str]:
    from dvc.repo import Repo

    with Repo(str(workdir)) as repo:
        return {normalise(stage.cmd) for stage in repo.index.stages}


def copy_workflow(dst: Path) -> Path:
    for name in ("Snakefile", "workflow", "params.yaml", "dvc.yaml", ".dvc"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    return dst


def test_snakemake_and_dvc_run_the_same_commands(tmp_path: Path) -> None:
    work = copy_workflow(tmp_path)
    smk, dvc = snakemake_commands(work), dvc_commands(work)
    assert len(smk) >= 15, sorted(smk)
    assert smk == dvc, f"only in Snakemake: {sorted(smk - dvc)}\nonly in DVC: {sorted(dvc - smk)}"


def test_every_cli_stage_is_in_the_dag(tmp_path: Path) -> None:
    """No stage is orphaned: each pipeline command of the CLI appears in the DAG (except `score`)."""
    from caprl.cli import STAGES

    commands = snakemake_commands(copy_workflow(tmp_path))
    used = {cmd.split()[1] for cmd in commands}
    assert set(STAGES) - used <= {"score"}, set(STAGES) - used
