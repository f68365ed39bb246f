"""Snakemake and DVC run the same set of `caprl` commands (same stages, same arguments), and
the committed dvc.yaml is the one `caprl dvc-yaml` writes from the committed params.yaml."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

from conftest import REPO


def normalise(cmd: str) -> str:
    return re.sub(r"\s+", " ", cmd).strip()


def snakemake_commands(workdir: Path, *targets: str) -> set[str]:
    proc = subprocess.run(["snakemake", "-n", "-p", "--forceall", "--cores", "1", *(targets or ("all_tables",))],
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
    # all_tables needs the listener run's gold-caption retrieval (the tables read it); it is the only one
    gold = [c for c in smk if c.startswith("caprl retrieval ") and " --gold " in c]
    assert [c.split("--run ")[1].split()[0] for c in gold] == ["listener"], gold
    assert "--out results/synthetic/listener/retrieval.json" in gold[0] and "--captions" not in gold[0]


def test_every_cli_stage_is_in_the_dag(tmp_path: Path) -> None:
    """No stage is orphaned: each pipeline command of the CLI appears in the DAG (except the tools);
    tune-report is in the tuning target's (snakemake tuning: params.yaml's tuning grids); claims and
    claims-summary in the claims targets' (all_claims: tests/test_claims_dag.py runs them)."""
    from caprl.cli import STAGES, TOOLS

    commands = snakemake_commands(copy_workflow(tmp_path), "all_tables", "tuning")
    used = {cmd.split()[1] for cmd in commands} | {"claims", "claims-summary"}
    assert set(STAGES) - used <= TOOLS, set(STAGES) - used
    claims_smk = (REPO / "workflow" / "rules" / "claims.smk").read_text()
    assert '"caprl claims --log' in claims_smk and claims_smk.count('"caprl claims-summary --publish') == 2


def test_committed_dvc_yaml_is_current() -> None:
    from caprl import params as params_mod
    from caprl.workflow.dvc import render

    expected = render(params_mod.load(REPO / "params.yaml"))
    assert (REPO / "dvc.yaml").read_text() == expected, "dvc.yaml is stale: run `caprl dvc-yaml`"


def test_two_datasets_and_run_subsets_give_the_same_commands(tmp_path: Path) -> None:
    """A second generated dataset, a run limited to one dataset: both tools, the same jobs."""
    import yaml

    from caprl.workflow.dvc import render
    from conftest import two_dataset_params

    work = copy_workflow(tmp_path)
    params = two_dataset_params()
    params["runs"]["stackcap-xe"] = {"method": "xe", "model": "stackcap", "datasets": ["shapes_b"]}
    params["runs"]["stackcap-c2f"] = {"method": "c2f", "model": "stackcap", "init": {"model": "stackcap-xe"},
                                      "datasets": ["shapes_b"]}
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (work / "dvc.yaml").write_text(render(params))
    smk, dvc = snakemake_commands(work), dvc_commands(work)
    assert smk == dvc, f"only in Snakemake: {sorted(smk - dvc)}\nonly in DVC: {sorted(dvc - smk)}"
    for ds in ("synthetic", "shapes_b"):
        assert any(c.startswith("caprl tables ") and f"--dataset {ds} " in c for c in smk), ds
        assert any(f"--out-raw data/raw/{ds}/dataset_{ds}.json" in c for c in smk), ds
    trained = {(c.split("--dataset ")[1].split()[0], c.split("--run ")[1].split()[0])
               for c in smk if c.startswith("caprl train ")}
    assert ("shapes_b", "stackcap-c2f") in trained and ("synthetic", "stackcap-c2f") not in trained
    assert ("synthetic", "fc-scst") in trained and ("shapes_b", "fc-scst") in trained
    assert any("--dataset shapes_b" in c and "--checkpoint runs/shapes_b/stackcap-c2f/best.pt" in c
               for c in smk if c.startswith("caprl attention-figure "))


def test_a_bottomup_dataset_gives_the_same_commands(tmp_path: Path) -> None:
    """A dataset with backbone bottomup: its features file is converted from the TSVs (one job, no
    shards, no merge, no attention figure), the other dataset's still extracted; both tools agree."""
    import yaml

    from caprl.workflow.dvc import render
    from conftest import two_dataset_params

    work = copy_workflow(tmp_path)
    params = two_dataset_params()
    tsvs = ["data/raw/bottomup/part0.tsv", "data/raw/bottomup/part1.tsv"]
    params["datasets"]["shapes_b"].update(backbone="bottomup", bottomup_tsv=tsvs)
    for tsv in tsvs:  # the workflow only checks that they are there
        (work / tsv).parent.mkdir(parents=True, exist_ok=True)
        (work / tsv).touch()
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (work / "dvc.yaml").write_text(render(params))
    smk, dvc = snakemake_commands(work), dvc_commands(work)
    assert smk == dvc, f"only in Snakemake: {sorted(smk - dvc)}\nonly in DVC: {sorted(dvc - smk)}"
    by_stage = {stage: [c for c in smk if c.startswith(f"caprl {stage} ")]
                for stage in ("bottomup", "features", "merge-features", "attention-figure")}
    assert by_stage["bottomup"] == [
        "caprl bottomup --params params.yaml --log logs/shapes_b/features_bottomup.log --tsv " + " ".join(tsvs)
        + " --annotations data/shapes_b/annotations.json --dataset shapes_b --out data/shapes_b/features_bottomup.h5"]
    for stage in ("features", "merge-features", "attention-figure"):
        assert by_stage[stage] and not any("shapes_b" in c for c in by_stage[stage]), stage
    assert any("--features data/shapes_b/features_bottomup.h5" in c for c in smk if c.startswith("caprl train "))


def test_one_source_for_what_a_training_job_depends_on() -> None:
    """Snakemake's params trigger (the plan's TrainJob.settings) and DVC's stage params read the same
    keys: a change of any of them re-plans the job under both engines (they differed: Snakemake
    watched the dataset's settings and not the listener's, DVC the listener's and not the dataset's)."""
    import copy

    from caprl import params as params_mod
    from caprl.workflow import dvc as dvc_gen
    from caprl.workflow.plan import build_plan, lookup

    params = params_mod.load(REPO / "params.yaml")
    plan = build_plan(params)
    stages = dvc_gen.dvc_stages(plan)
    jobs = [job for ds in plan.datasets for job in plan.trained(ds)]
    assert any(job.retrieval or job.gold_retrieval for job in jobs)
    for job in jobs:
        keys = job.settings_keys(plan.params)
        assert stages[f"{job.dataset}-train-{job.run}"]["params"] == keys, job.run
        if job.retrieval or job.gold_retrieval:
            assert "listener" in keys
        if job.spec.options.get("reward"):
            assert f"rewards.{job.spec.options['reward']}" in keys
    job = next(job for job in jobs if job.retrieval)
    before = job.settings(plan.params)
    for key in job.settings_keys(plan.params):
        changed = copy.deepcopy(plan.params)
        *head, last = key.split(".")
        parent = lookup(changed, ".".join(head)) if head else changed
        parent[last] = {"changed": True}
        assert job.settings(changed) != before, key  # Snakemake's params trigger fires


def test_runs_that_others_start_from_are_scheduled_first_and_the_longest_among_equals(tmp_path: Path) -> None:
    """The train rule's priority (caprl.workflow.priority): its whole part is the number of training
    jobs waiting on the run (Plan.waiting_on: at d13de75 Snakemake left Top-Down's XE start for last
    and trained it alone for 111 s, its RL runs waiting); its fraction orders equals by `caprl plan`'s
    estimate, the longest first (PG-SPIDEr's CIDEr-D run, started last, trained alone for up to 132 s);
    the data rules come before them all."""
    from caprl import params as params_mod
    from caprl.workflow import costs
    from caprl.workflow.plan import build_plan

    proc = subprocess.run(["snakemake", "-n", "--cores", "2", "all_tables"], capture_output=True, text=True,
                          cwd=copy_workflow(tmp_path), check=True)
    job = re.compile(r"^rule train:\n(?:    .*\n)*?    wildcards: dataset=synthetic, run=(\S+)\n"
                     r"(?:    priority: ([\d.]+)\n)?", re.M)  # one job's indented lines only
    priority = {run: float(value or 0) for run, value in job.findall(proc.stdout + proc.stderr)}
    params = params_mod.load(REPO / "params.yaml")
    plan = build_plan(params)
    hours = {row.run: row.hours for row in costs.estimate(params, "cpu").rows
             if row.rule == "train" and row.dataset == "synthetic"}
    starts = {source for job in plan.trained("synthetic") for source in job.spec.init.values()}
    assert starts >= {"fc-xe", "fc_lstm-xe", "fc_lstm_state-xe", "topdown-xe", "transformer-xe", "lstm3-xe", "listener"}
    for job in plan.trained("synthetic"):
        assert math.floor(priority[job.run]) == plan.waiting_on("synthetic", job.run), job.run
        assert (priority[job.run] >= 1) == (job.run in starts), job.run
    leaves = [run for run in priority if run not in starts]
    assert all(priority[a] >= priority[b] for a in leaves for b in leaves if hours[a] > hours[b])
    assert priority["fc-xe"] > priority["topdown-xe"] > 1 > priority["fc_lstm-pg_spider-cider_d"] > priority["fc-scst"] > 0
    # the data rules before every training job (at bd8522f the video set was prepared after the image
    # set's RL runs, its XE start then trained alone)
    # (a dry run shows job groups as a cluster would run them: prepare -> vocab indented in group "data")
    data = [(rule, value) for _, rule, value in re.findall(
        r"^( *)rule (synthesize|synthesize_video|prepare|vocab|references|cider_df|features|merge_features):"
        r"\n(?:\1    .*\n)*?\1    priority: ([\d.]+)\n", proc.stdout + proc.stderr, re.M)]
    assert {rule for rule, _ in data} == {"synthesize", "synthesize_video", "prepare", "vocab", "references",
                                          "cider_df", "features", "merge_features"}
    assert min(float(value) for _, value in data) > max(priority.values())


def test_a_dataset_of_ones_own_not_yet_prepared_is_ordered_by_waiting_on_alone(tmp_path: Path, monkeypatch) -> None:
    """A real dataset with no annotations yet and no known size cannot be costed: the train rule's
    priority is then how many runs start from each run (the DAG builds; its first job prepares the
    data), where with a size it adds the estimate's fraction."""
    from caprl import params as params_mod
    from caprl.workflow.plan import build_plan
    from caprl.workflow.priority import train_priorities

    params = params_mod.read([str(REPO / "params.yaml")])
    params["datasets"]["synthetic"]["enabled"] = params["datasets"]["synthetic_video"]["enabled"] = False
    params["datasets"]["mine"] = {"format": "karpathy", "raw": "raw/mine.json", "media_root": "raw/images",
                                  "generate": False, "backbone": "tinycnn", "enabled": True}
    monkeypatch.chdir(tmp_path)  # no data/mine/annotations.json here
    plan = build_plan(params_mod.resolve(params))
    priorities = train_priorities(plan)
    assert priorities and all(value == plan.waiting_on(ds, run) for (ds, run), value in priorities.items())
    assert max(priorities.values()) >= 1  # XE runs others start from still go first
