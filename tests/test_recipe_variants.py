"""The recipe variants (configs/recipes/variants/, issue 57): one per objective beyond the
papers (GRPO, PPO-KL, DiCO), each laid over transformer-coco.yaml. Each validates over params.yaml
and its base, plans exactly the runs it lists, sets every key its new objective reads, cites
every value, keeps the base's runs as they are, and dry-runs under Snakemake with both
--configfile files, as its header's command."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from caprl import params as params_mod
from caprl.workflow import plan as wp
from conftest import REPO
from test_recipes import TRAIN_JOB, read_yaml, stand_in_checkout, uncited_lines

BASE = REPO / "configs" / "recipes" / "transformer-coco.yaml"
VARIANTS = sorted((REPO / "configs" / "recipes" / "variants").glob("*.yaml"))
IDS = [p.stem for p in VARIANTS]
NEW = {"transformer_grpo-coco": "grpo", "transformer_ppo_kl-coco": "ppo_kl", "transformer_dico-coco": "dico"}


def files(path: Path) -> list[Path]:
    return [REPO / "params.yaml", BASE, path]


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[dict[str, Any], wp.Plan]]:
    out = {}
    for path in VARIANTS:
        params = params_mod.load(files(path))
        out[path.stem] = (params, wp.build_plan(params))
    return out


def test_there_is_a_variant_per_new_objective_and_the_readme_lists_it() -> None:
    assert IDS == sorted(NEW)
    readme = (REPO / "configs" / "recipes" / "README.md").read_text(encoding="utf-8")
    assert all(f"`variants/{p.name}`" in readme for p in VARIANTS)


@pytest.mark.parametrize("path", VARIANTS, ids=IDS)
def test_a_variant_plans_exactly_its_runs_on_coco(path: Path, loaded: dict) -> None:
    params, plan = loaded[path.stem]
    listed = read_yaml(path)["datasets"]["coco"]["runs"]
    assert params_mod.enabled_datasets(params) == ["coco"]
    assert sorted(job.run for job in plan.trained("coco")) == sorted(listed) and not plan.skipped
    assert any(params["runs"][run]["method"] == NEW[path.stem] for run in listed)


@pytest.mark.parametrize("path", VARIANTS, ids=IDS)
def test_a_variant_sets_every_key_of_its_objective_and_keeps_the_base_runs(path: Path) -> None:
    variant, base, demo = read_yaml(path), read_yaml(BASE), read_yaml(REPO / "params.yaml")
    merged = params_mod.read(files(path))
    method = NEW[path.stem]
    resolved = set(demo["objective_defaults"]) | set(demo["objectives"][method])
    own = set(variant["objectives"][method])
    assert own <= resolved and resolved - own <= set(base["objective_defaults"]), sorted(resolved - own)
    for name, entry in variant["runs"].items():
        assert merged["runs"][name] == entry and name not in base["runs"]
        for option, value in entry.get("options", {}).items():  # a run repeats its objective's values
            if option in variant["objectives"].get(entry["method"], {}):
                assert variant["objectives"][entry["method"]][option] == value, (name, option)
    for name in base["runs"]:
        assert merged["runs"][name] == base["runs"][name]


@pytest.mark.parametrize("path", VARIANTS, ids=IDS)
def test_every_variant_value_cites_its_source(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert uncited_lines(text) == []
    command = f"--configfile configs/recipes/transformer-coco.yaml configs/recipes/variants/{path.name}"
    assert text.startswith("# Recipe variant:") and f"snakemake --profile slurm all_tables {command}" in text


def test_snakemake_dry_runs_each_variant_over_its_base(tmp_path_factory: pytest.TempPathFactory,
                                                        loaded: dict) -> None:
    procs = {}
    for path in VARIANTS:
        work = tmp_path_factory.mktemp(path.stem)
        stand_in_checkout(work, BASE, loaded[path.stem][1])
        (work / "configs" / "recipes" / "variants").mkdir(parents=True, exist_ok=True)
        (work / "configs" / "recipes" / "variants" / path.name).write_text(path.read_text())
        cmd = ["snakemake", "-n", "--cores", "1", "all_tables", "--configfile",
               "configs/recipes/transformer-coco.yaml", f"configs/recipes/variants/{path.name}"]
        procs[path.stem] = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for path in VARIANTS:
            stdout, _ = procs[path.stem].communicate(timeout=300)
            assert procs[path.stem].returncode == 0, stdout[-4000:]
            jobs = TRAIN_JOB.findall(stdout)
            assert sorted(run for _, run, _ in jobs) == sorted(read_yaml(path)["datasets"]["coco"]["runs"])
            runtime = read_yaml(path)["resources"]["train"]["runtime"]
            assert {int(r) for _, _, r in jobs} == {runtime}  # the variant's resources reach the jobs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
