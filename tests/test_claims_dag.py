"""The papers' claims as targets of the one DAG (workflow/rules/claims.smk): each (paper, seed) a
module of the workflow under claims/<paper>/seed<k>/, each of its runs a job, the verdicts a rule
that reads every seed's scores, all_claims publishing them to results/claims/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import TINY, default_params, merge
from test_e2e import fresh_copy, run

CLAIM = {"id": "scst-beats-xe", "text": "SCST > XE (CIDEr-D)", "source": "a test's", "a": "fc-scst",
         "b": "fc-xe", "metric": "metrics.CIDEr-D", "kind": "greater"}


def claims_config(paper: str, seeds: list[int]) -> dict[str, Any]:
    return {"paper": paper, "title": "a tiny claim", "seeds": seeds,
            "demo": {"runs": ["fc-xe", "fc-scst"], "evaluate": {"metrics": ["bleu", "cider_d"],
                                                                   "diversity": {"methods": []}}, "tables": ["main"]},
            "claims": [CLAIM]}


def workspace(tmp_path: Path, papers: dict[str, list[int]], min_seeds: int = 2) -> Path:
    """A fresh copy of the workflow at TINY sizes whose claims are ``papers`` (paper -> seeds)."""
    params = merge(default_params(), TINY)
    configs = tmp_path / "claims_configs"
    configs.mkdir(parents=True)
    for paper, seeds in papers.items():
        (configs / f"{paper}_tiny.yaml").write_text(yaml.safe_dump(claims_config(paper, seeds), sort_keys=False))
    params["claims"] = {"configs": str(configs), "papers": sorted(papers), "min_seeds": min_seeds}
    params["runs"] = {r: params["runs"][r] for r in ("fc-xe", "fc-scst")}
    params["tuning"]["runs"] = {}
    params["tables"] = ["main"]
    params["datasets"]["synthetic"].pop("tables", None)
    return fresh_copy(tmp_path / "work", params)


def dry_jobs(work: Path, target: str, *args: str) -> dict[str, int]:
    """rule -> jobs of a dry run of ``target``."""
    return job_stats(run(["snakemake", "-n", target, *args], work))


def job_stats(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """rule -> jobs, from Snakemake's job stats."""
    counts = {}
    for line in (proc.stdout + proc.stderr).split("Job stats:", 1)[1].split("\n\n", 1)[0].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def test_each_seed_is_a_module_whose_jobs_live_in_its_folder(tmp_path):
    """Dry run: every seed of every enabled paper trains and evaluates each run in its own folder,
    with its own params file (the config's overrides and its seed), and one verdicts job per paper."""
    work = workspace(tmp_path, {"900": [1, 2], "901": [3, 4]})
    jobs = dry_jobs(work, "all_claims")
    for paper, seeds in (("900", (1, 2)), ("901", (3, 4))):
        for seed in seeds:
            assert jobs[f"claims_{paper}_seed{seed}_train"] == 2 and jobs[f"claims_{paper}_seed{seed}_evaluate"] == 2
            params = yaml.safe_load((work / "claims" / paper / f"seed{seed}" / "params.yaml").read_text())
            assert params["seed"] == seed and set(params["runs"]) == {"fc-xe", "fc-scst"}
            assert params["tracking"]["experiment"].endswith(f"/claims/{paper}/seed{seed}") and "claims" not in params
        assert jobs[f"claims_{paper}_verdicts"] == 1
    assert "train" not in jobs and jobs["all_claims"] == 1  # the main workflow's runs are not claims' inputs
    assert dry_jobs(work, "claims_901").keys() >= {"claims_901_verdicts", "claims_901_seed3_train"}
    assert not any(k.startswith("claims_900") for k in dry_jobs(work, "claims_901"))


def test_a_config_with_fewer_seeds_than_min_seeds_is_refused_naming_it(tmp_path):
    work = workspace(tmp_path, {"900": [1, 2]}, min_seeds=3)
    proc = subprocess.run(["snakemake", "-n", "all_claims"], cwd=work, capture_output=True, text=True)
    assert proc.returncode != 0 and "900_tiny.yaml" in proc.stderr + proc.stdout
    assert "at least 3" in proc.stderr + proc.stdout


@pytest.mark.e2e
def test_all_claims_builds_every_seed_and_publishes_the_verdicts(tmp_path):
    """Real Snakemake, 2 seeds: the verdicts read both seeds' scores (paired, each seed its own data
    and weights), record each seed's params file, and all_claims publishes them with the summary; a
    second all_claims re-runs no job but publishes again."""
    work = workspace(tmp_path, {"900": [1, 2]})
    run(["snakemake", "--cores", "2", "all_claims"], work)
    verdicts = json.loads((work / "claims" / "900" / "verdicts.json").read_text())
    published = json.loads((work / "results" / "claims" / "900.json").read_text())
    assert published == verdicts and (work / "results" / "claims" / "summary.md").exists()
    assert (work / "results" / "claims" / "900.png").read_bytes() == (work / "claims" / "900" / "verdicts.png").read_bytes()
    (result,) = verdicts["results"]
    assert result["id"] == "scst-beats-xe" and len(result["a"]) == len(result["b"]) == 2
    assert verdicts["meta"]["dag"]["target"] == "claims_900" and verdicts["meta"]["dag"]["train_seconds"] > 0
    seeds = verdicts["per_seed"]
    assert seeds["1"]["runs"]["synthetic/fc-xe"]["metrics"] != seeds["2"]["runs"]["synthetic/fc-xe"]["metrics"]
    assert seeds["2"]["params_file"] == "claims/900/seed2/params.yaml" and len(seeds["2"]["params_sha256"]) == 64
    assert "| 900 |" in (work / "results" / "claims" / "summary.md").read_text()
    tables = (work / "results" / "claims" / "900_tables.md").read_text()  # the main table over the 2 seeds
    assert "## synthetic/main" in tables and "over 2 seeds (1, 2)" in tables and " ± " in tables
    from mlflow.tracking import MlflowClient  # every run of a seed tagged: the UI finds a claim's runs

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments() if "/claims/900/seed" in e.name]
    tagged = client.search_runs(experiments, "tags.`caprl.claims.paper` = '900'", max_results=1000)
    assert len(experiments) == 2 and len(tagged) == len(client.search_runs(experiments, max_results=1000))
    assert {(r.data.tags["caprl.claims.seed"], r.data.tags["caprl.job"]) for r in tagged} >= {
        ("1", "synthetic/fc-xe/train"), ("2", "synthetic/fc-scst/train"), ("2", "synthetic/fc-scst/evaluate")}
    assert {r.data.tags["caprl.claims.config"] for r in tagged} == {"900_tiny.yaml"}
    check_claims_report(work, tmp_path / "claims_report.png")
    again = run(["snakemake", "--cores", "2", "all_claims"], work)
    assert "claims_900_seed1_train" not in again.stderr and "all_claims" in again.stderr


def check_claims_report(work: Path, png: Path) -> None:
    """`snakemake --report report.html all_claims`: the paper's forest plot and its rliable aggregate
    under category Claims, each with its caption; in headless Chromium each figure's view shows it."""
    from report_check import embedded, report_view
    from screenshot import chromium_path, non_trivial, screenshot

    run(["snakemake", "--report", "report.html", "all_claims"], work)
    html = (work / "report.html").read_text(encoding="utf-8")
    results, categories = embedded(html, "results"), embedded(html, "categories")
    figures = ["claims/900/verdicts.png", "claims/900/verdicts_aggregate.png"]  # forest plot, rliable aggregate
    placed = {path for sub in categories.get("Claims", {}).values() for path in sub}
    assert set(figures) <= placed, (sorted(placed), sorted(categories))
    assert all(results[path]["caption"].strip() for path in figures)
    if chromium_path() is None:
        return
    for path in figures:
        page = work / f"report_{Path(path).stem}.html"
        page.write_text(report_view(html, f"app.setView({{content: 'img', navbarMode: 'resultinfo', resultPath: "
                                          f"{json.dumps(path)}, contentPath: results[{json.dumps(path)}].data_uri}});"))
        shot = png.with_name(f"{png.stem}_{Path(path).stem}.png")
        dom = work / f"{page.stem}.dom.html"
        screenshot(page, shot, 1600, 1000, 3000, dom=dom)
        rendered = dom.read_text(encoding="utf-8")
        assert non_trivial(shot) and '<img src="data:image/png' in rendered, path
        assert results[path]["data_uri"].split(",", 1)[1][:40] in rendered, f"{path}: another figure shown"


def test_plan_counts_the_jobs_the_claims_dag_runs(tmp_path):
    """`caprl claims-plan`: per paper the jobs of every seed that its verdicts need (no tables,
    curves or figures) and its verdicts job, as many as Snakemake's dry run of the verdicts; N seeds
    asked for instead of the config's scale it."""
    work = workspace(tmp_path, {"900": [1, 2]})
    (row,) = json.loads(run(["caprl", "claims-plan", "--format", "json", "--device", "cpu"], work).stdout)["claims"]
    assert row["paper"] == "900" and row["seeds"] == 2 and row["hours"] > 0
    assert row["jobs"] == sum(dry_jobs(work, "claims_900_verdicts").values())
    (five,) = json.loads(run(["caprl", "claims-plan", "--seeds", "5", "--format", "json", "--device", "cpu"], work).stdout)["claims"]
    assert (five["jobs"] - 1) * 2 == 5 * (row["jobs"] - 1) and five["hours"] == pytest.approx(2.5 * row["hours"])


MINI = {"format": "karpathy", "raw": "data/raw/mini/dataset_synthetic.json", "media_root": "data/raw/mini/images",
        "generate": False, "backbone": "tinycnn", "enabled": True}


@pytest.mark.e2e
def test_on_a_real_dataset_every_seed_reads_the_data_made_once(tmp_path):
    """A recipe enabling a dataset of a real format (generate: false; its raw files the generator's,
    copied): all_claims prepares its data and extracts its features once, and every seed reads those
    files (hard links: one inode) while training from its own seed; its verdicts bind the claim's
    bare run names to that dataset."""
    work = workspace(tmp_path, {"900": [1, 2]})
    run(["snakemake", "--cores", "1", "data/raw/synthetic/dataset_synthetic.json"], work)
    shutil.copytree(work / "data" / "raw" / "synthetic", work / "data" / "raw" / "mini")
    recipe = work / "configs" / "recipes" / "mini.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(yaml.safe_dump({"datasets": {"synthetic": {"enabled": False}, "synthetic_video": {"enabled": False},
                                                   "mini": MINI}, "claims": {"papers": ["900"]}}))
    jobs = job_stats(run(["snakemake", "--cores", "2", "all_claims", "--configfile", str(recipe)], work))
    assert jobs["prepare"] == jobs["vocab"] == jobs["merge_features"] == 1
    assert not any(rule.startswith("claims_900_seed") and rule.endswith(("_prepare", "_features")) for rule in jobs)
    for seed in (1, 2):
        linked = work / "claims" / "900" / f"seed{seed}" / "data" / "mini"
        for name in ("annotations.json", "labels.h5", "features_tinycnn.h5"):
            assert os.stat(linked / name).st_ino == os.stat(work / "data" / "mini" / name).st_ino, (seed, name)
    verdicts = json.loads((work / "claims" / "900" / "verdicts.json").read_text())
    seeds = verdicts["per_seed"]
    assert seeds["1"]["runs"]["mini/fc-xe"]["metrics"] != seeds["2"]["runs"]["mini/fc-xe"]["metrics"]
    assert len(verdicts["results"][0]["a"]) == 2 and verdicts["outside"] == []


def test_a_recipes_claims_share_its_data_and_the_plan_counts_the_dry_runs_jobs(tmp_path):
    """configs/recipes/transformer-coco.yaml (stand-in raw files): all_claims prepares coco once, links
    its data into each of paper 005's five seeds, trains only the Transformer's runs (the Top-Down
    claims are outside the recipe), and `caprl claims-plan` counts as many jobs as the dry run."""
    from test_recipes import stand_in_checkout
    from caprl import params as params_mod
    from caprl.workflow import plan as wp

    recipe = Path(__file__).resolve().parents[1] / "configs" / "recipes" / "transformer-coco.yaml"
    params = params_mod.resolve(params_mod.read([str(recipe.parents[2] / "params.yaml"), str(recipe)]))
    stand_in_checkout(tmp_path, recipe, wp.build_plan(params))
    args = ["--configfile", f"configs/recipes/{recipe.name}"]
    jobs = dry_jobs(tmp_path, "claims_005_verdicts", *args)
    assert jobs["prepare"] == jobs["bottomup_features"] == 1
    for seed in range(1, 6):
        assert jobs[f"claims_005_seed{seed}_train"] == 3 and jobs[f"claims_005_seed{seed}_shared_data"] >= 5
    plan = run(["caprl", "claims-plan", "--params", "params.yaml", *args[1:], "--format", "json"], tmp_path)
    (row,) = json.loads(plan.stdout)["claims"]
    assert (row["paper"], row["claims"], row["outside"]) == ("005", 1, 3)
    assert row["jobs"] == sum(jobs.values())


def test_a_seeds_jobs_get_the_profiles_set_resources_and_the_rules_groups(tmp_path):
    """The SLURM profile's set-resources name the main rules (`train: cpus_per_gpu`): a seed's
    train jobs ask for the same; its prepare -> vocab and evaluate jobs are job groups as the main
    workflow's are (the rules' `group:`; shown by a dry run as a cluster would submit them)."""
    work = workspace(tmp_path, {"900": [1]}, min_seeds=1)
    proc = run(["snakemake", "-n", "all_claims", "--set-resources", "train:cpus_per_gpu=7"], work)
    text = proc.stdout + proc.stderr
    trains = re.findall(r"rule claims_900_seed1_train:\n(?:    .*\n)*?    resources: (.*)", text)
    assert len(trains) == 2 and all("cpus_per_gpu=7" in r for r in trains), trains
    groups = re.findall(r"Group job (\w+)", text)
    assert {"data", "evaluation"} <= set(groups), groups
