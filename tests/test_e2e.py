"""The whole pipeline, as a user runs it, on a tiny synthetic configuration.

Real Snakemake, DVC, MLflow (sqlite) and pycocoevalcap, in a fresh copy of the workflow.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from caprl.workflow.dvc import render
from caprl.run_points import expand_sweeps
from caprl.workflow.plan import build_plan
from conftest import REPO, TINY, TINY_VIDEO, default_params, full_run, merge
from report_check import check_curves, check_mlflow_compare, check_report

pytestmark = pytest.mark.e2e

PARAMS = merge(default_params(), merge(TINY, {"datasets": {"synthetic_video": TINY_VIDEO}}))
# Papers 003/004 here: the listener, Luo (frozen listener), ST and PSST multinomial (trained listener,
# relaxed rows), both frozen speakers, value + actor-critic; the other methods run in their unit and
# GPU tests (CI time). DVC (it runs its stages one at a time) re-runs the fc model's XE, SCST and
# PSST runs with the main and operating-point tables, and (`pytest --full`) the video set's XE run
# (paper 002's model, fc_lstm_state).
DISC_LEFT_OUT = ("reinforce_joint", "st_gumbel", "psst_gumbel")
DVC_METHODS = ("xe", "scst", "listener", "psst_multinomial")
DVC_TABLES = {"synthetic": ["main", "psst_points"], "synthetic_video": ["main"]}
DVC_MODELS = {"synthetic": "fc", "synthetic_video": "fc_lstm_state"}
PARAMS["datasets"]["synthetic"]["runs"] = [
    run for run, spec in expand_sweeps(PARAMS)["runs"].items() if spec["method"] not in DISC_LEFT_OUT]
PLAN = build_plan(PARAMS)
RUNS = [job.run for job in PLAN.evaluated("synthetic")]      # evaluated: in the tables
TRAINED = [job.run for job in PLAN.trained("synthetic")]
VIDEO = "synthetic_video"  # the built-in video set (TGIF format): its own runs and tables


def fresh_copy(dst: Path, params: dict[str, Any]) -> Path:
    """The workflow in ``dst`` with these params and the dvc.yaml `caprl dvc-yaml` writes for them."""
    dst.mkdir(parents=True)
    for name in ("Snakefile", "workflow", ".dvc", ".dvcignore", ".gitignore", "src"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name,
                                                            **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info", "tmp")} if src.is_dir() else {}))
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (dst / "dvc.yaml").write_text(render(params))
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    return dst


def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def metrics(workdir: Path) -> dict[str, dict[str, float]]:
    return {r: json.loads((workdir / "results" / "synthetic" / r / "scores.json").read_text())["metrics"]
            for r in RUNS + ["most-frequent"]}


def all_scores(workdir: Path, plan: Any = None) -> dict[str, dict[str, Any]]:
    """Every score file of every dataset of ``plan`` (default: PLAN; metrics and the diversity
    section), by dataset/run."""
    plan = plan or PLAN
    return {f"{ds}/{r}": json.loads((workdir / "results" / ds / r / "scores.json").read_text())
            for ds in plan.datasets for r in [job.run for job in plan.evaluated(ds)] + ["most-frequent"]}


@pytest.fixture(scope="module")
def snakemake_run(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    if any("dvc_run" in item.fixturenames for item in request.session.items if item.path == request.path):
        request.getfixturevalue("dvc_started")  # DVC's stages run beside Snakemake's jobs (wall time)
    work = fresh_copy(tmp_path_factory.mktemp("e2e") / "snakemake", PARAMS)
    run(["snakemake", "--cores", "2", "all_tables"], work)
    return work


def test_snakemake_writes_the_tables(snakemake_run: Path) -> None:
    tables = snakemake_run / "results" / "tables"
    md = (tables / "synthetic_main.md").read_text()
    for row in ("fc (XE)", "fc (SCST)", "topdown (XE)", "topdown (SCST)", "stackcap (C2F)",
                "most frequent training caption"):
        assert row in md
    for name in ("stackcap_table1", "stackcap_table2"):  # every row filled for the metrics computed
        lines = (tables / f"synthetic_{name}.md").read_text().splitlines()
        header = [c.strip() for c in next(line for line in lines if line.startswith("| Approach")).split("|")[1:-1]]
        rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines
                if line.startswith("| ") and not line.startswith("| Approach")]
        assert len(rows) == 6, rows
        for column in ("B@1", "B@4", "C"):  # TINY evaluates BLEU, ROUGE-L, CIDEr-D (no METEOR)
            assert all(row[header.index(column)] != "—" for row in rows), (column, rows)
    assert "Stack-Cap (C2F), ours" in (tables / "synthetic_stackcap_table3.md").read_text()
    figures = sorted((snakemake_run / "results" / "figures" / "synthetic" / "attention").glob("*.png"))
    assert len(figures) == PARAMS["figures"]["attention_images"]
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in figures)
    assert "SPICE: not computed" in md  # reported as unavailable, never a number
    skipped = PLAN.skipped_runs("synthetic")  # shown as unavailable rows, with the reason
    assert (tables / "synthetic_main.csv").read_text().count("\n") == len(RUNS) + len(skipped) + 2
    assert all(f"{run}: unavailable" in md for run in skipped)
    assert "\\begin{tabular}" in (tables / "synthetic_main.tex").read_text()
    scores = metrics(snakemake_run)
    for run_name, values in scores.items():
        assert set(values) >= {"BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"}, run_name
        assert "SPICE" not in values


def test_the_video_set_and_the_sle_tables(snakemake_run: Path) -> None:
    """The synthetic video set goes through the TGIF reader and per-frame features; SLL, SLL-ME
    and SLL-SLE train on both sets; Tables 2-4 and the samples view are filled."""
    import h5py

    annotations = json.loads((snakemake_run / "data" / VIDEO / "annotations.json").read_text())
    sizes = PARAMS["datasets"][VIDEO]["synthetic"]
    assert annotations["stats"]["split_images"] == {s: sizes[f"n_{s}"] for s in ("train", "val", "test")}
    assert annotations["stats"]["skipped_media"] == []
    backbone = PARAMS["datasets"][VIDEO]["backbone"]
    segments = PARAMS["datasets"][VIDEO].get("video", {}).get("segments", PARAMS["features"]["video"]["segments"])
    with h5py.File(snakemake_run / "data" / VIDEO / f"features_{backbone}.h5") as f:
        assert f.attrs["media"] == "video" and f.attrs["frames"] == PARAMS["features"]["video"]["frames"]
        assert f["regions"].shape[1] == PARAMS["features"]["video"]["frames"]  # frames as regions
        assert f.attrs["segments"] == segments and f["pooled"].shape[1] == f["regions"].shape[2]
    tables = snakemake_run / "results" / "tables"
    assert not list(tables.glob(f"{VIDEO}_stackcap*"))  # the video set's own tables: params' datasets.<name>.tables
    for ds, table in (("synthetic", "sle_table2"), (VIDEO, "sle_table3")):
        md = (tables / f"{ds}_{table}.md").read_text()
        for run_name in ("fc_lstm_state-sll", "fc_lstm_state-sll_me", "fc_lstm_state-sll_sle", "topdown-sll_sle"):
            row = next(line for line in md.splitlines() if f"[{run_name}]" in line)
            assert row.split("|")[3].strip()[0].isdigit(), row  # CIDEr-D column filled
    for ds in PLAN.datasets:
        md = (tables / f"{ds}_sle_table4.md").read_text()
        rows = [line for line in md.splitlines() if "(SLL-SLE, rs) [fc_lstm_state-sll_sle]" in line]
        assert rows and all(c.strip()[0].isdigit() for c in rows[0].split("|")[2:6]), rows
        samples = (tables / f"{ds}_sle_samples.md").read_text()
        assert "fc_lstm_state-sll_sle" in samples
    scores = all_scores(snakemake_run)[f"{VIDEO}/fc_lstm_state-sll_sle"]
    diversity = scores["diversity"]
    n = PARAMS["evaluate"]["diversity"]["samples"]
    assert set(diversity["rs"]) == set(diversity["bs"]) == {"CIDEr-D", "CIDEr-D_mean", "Div-1", "Div-2", "mBLEU-4",
                                                          "Self-CIDEr"}
    assert diversity["rs"]["CIDEr-D"] == diversity["rs"]["CIDEr-D_mean"]  # rs: the mean over samples; bs: the top beam
    assert diversity["bs"]["CIDEr-D"] == pytest.approx(scores["metrics"]["CIDEr-D"]) or \
        diversity["settings"]["beams"] != PARAMS["decode"]["beam_size"]
    assert all(len(ex["rs"]) == n and len(ex["bs"]) == n for ex in diversity["examples"])
    greedy = {name: s["greedy"]["metrics"]["CIDEr-D"] for name, s in all_scores(snakemake_run).items()
              if not name.endswith("/most-frequent")}
    assert greedy and all(0 <= v < 10 for v in greedy.values()), greedy  # evaluate.greedy: every run
    main = (tables / f"{VIDEO}_main.md").read_text()
    assert "| C | S | C greedy |" in main


def test_paper_004_runs_are_ranked_and_tabled(snakemake_run: Path) -> None:
    """The listener's pre-training, every discriminative method (one λ point here), the frozen
    speakers; each evaluated with beam 2 and ranked by its own listener; Tables 1-3, the ρ table,
    every point, Figs. 3-4."""
    retrieved = [job for job in PLAN.retrieved("synthetic")]
    methods = {job.spec.method for job in retrieved}
    assert methods == {"luo2018", "st_multinomial", "psst_multinomial", "frozen_speaker"}
    n_test = PARAMS["synthetic"]["n_test"]
    for job in retrieved:
        report = json.loads((snakemake_run / job.result("results/{dataset}/{run}/retrieval.json")).read_text())
        assert report["n_images"] == n_test and len(report["ranks"]) == n_test
        assert 0 <= report["R@1"] <= report["R@5"] <= report["R@10"] <= 1
        assert all_scores(snakemake_run)[f"synthetic/{job.run}"]["beam_size"] == 2
    tables = snakemake_run / "results" / "tables"
    points = (tables / "synthetic_psst_points.md").read_text()
    assert all(f"[{job.run}]" in points for job in retrieved)
    for name in ("psst_table1", "psst_table2", "psst_table3", "psst_rho"):
        assert (tables / f"synthetic_{name}.csv").exists()
    for figure in PLAN.psst_pngs("synthetic"):
        assert (snakemake_run / figure).read_bytes().startswith(b"\x89PNG")


def test_actor_critic_is_scored_by_beam_search_and_by_lookahead(snakemake_run: Path) -> None:
    """Paper 003: the value run (not a captioner), the actor-critic run scored twice in one
    evaluation (beam search, lookahead), Table 1 with both rows."""
    assert "fc-value" in TRAINED and "fc-value" not in RUNS and "fc-actor_critic" in RUNS
    scores = all_scores(snakemake_run)["synthetic/fc-actor_critic"]
    assert scores["lookahead"]["lambda"] == PARAMS["evaluate"]["lookahead"]["lam"]
    assert {"BLEU-4", "CIDEr-D"} <= set(scores["lookahead"]["metrics"])
    table = (snakemake_run / "results" / "tables" / "synthetic_ac_table1.md").read_text()
    rows = [line for line in table.splitlines() if "lookahead" in line.lower() and line.startswith("| ")]
    assert rows and rows[0].split("|")[2].strip()[0].isdigit(), rows


def test_second_run_is_a_no_op(snakemake_run: Path) -> None:
    """Running the main command again runs no job and rewrites no output (how long snakemake takes
    to see that is a benchmark figure, not a test: docs/benchmark.md)."""
    outputs = [f for d in ("results", "runs", "data") for f in (snakemake_run / d).rglob("*") if f.is_file()]
    before = {f: f.stat().st_mtime_ns for f in outputs}
    proc = run(["snakemake", "--cores", "2", "all_tables"], snakemake_run)
    log = proc.stdout + proc.stderr
    assert "Nothing to be done" in log and "Finished job" not in log
    assert {f: f.stat().st_mtime_ns for f in outputs} == before


def test_mlflow_has_one_run_per_job(snakemake_run: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{snakemake_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("caprl")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    names = sorted(r.info.run_name for r in runs)
    expected = sorted([f"{ds}/{job.run}/train" for ds in PLAN.datasets for job in PLAN.trained(ds)]
                      + [f"{ds}/{job.run}/evaluate" for ds in PLAN.datasets for job in PLAN.evaluated(ds)]
                      + [f"{ds}/most-frequent/evaluate" for ds in PLAN.datasets]
                      + [f"{ds}/{job.run}/retrieval" for ds in PLAN.datasets
                         for job in PLAN.retrieved(ds) + PLAN.gold_retrieved(ds)])
    assert names == expected
    ranked = next(r for r in runs if r.info.run_name == "synthetic/fc-frozen_speaker_mle/retrieval")
    assert 0 <= ranked.data.metrics["R_at_10"] <= 1
    train = next(r for r in runs if r.info.run_name == "synthetic/fc-scst/train")
    assert train.data.params["run.method"] == "scst"
    assert "val/CIDEr-D" in train.data.metrics and train.info.status == "FINISHED"
    history = client.get_metric_history(train.info.run_id, "train/loss")
    assert len(history) >= 1
    evaluation = next(r for r in runs if r.info.run_name == "synthetic/fc-scst/evaluate")
    assert evaluation.data.metrics["CIDEr-D"] == pytest.approx(metrics(snakemake_run)["fc-scst"]["CIDEr-D"])
    artifacts = {a.path for a in client.list_artifacts(evaluation.info.run_id)}
    assert {"captions.json", "scores.json", "examples.json"} <= artifacts


@pytest.fixture(scope="module")
def dvc_started(tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[tuple[Path, Any, subprocess.Popen]]:
    """The same params, DVC_METHODS' runs and DVC_TABLES only, started under `dvc repro` in another
    copy (through `caprl with-services`, as the docs run it; `dvc exp run` below runs without): its
    folder, plan and process. CI's reduced form leaves the video set out (its 13 stages: `pytest --full`)."""
    params = copy.deepcopy(PARAMS)
    runs = expand_sweeps(params)["runs"]
    if not full_run(request.config):
        params["datasets"][VIDEO]["enabled"] = False
    for ds, tables in DVC_TABLES.items():
        if not params["datasets"][ds].get("enabled", True):
            continue
        spec = params["datasets"][ds]
        spec.update(tables=tables, runs=[r for r in spec["runs"] if runs[r]["model"] == DVC_MODELS[ds]
                                         and runs[r]["method"] in DVC_METHODS[: 4 if ds == "synthetic" else 1]])
    work = fresh_copy(tmp_path_factory.mktemp("dvc") / "dvc", params)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    with (work / "dvc-repro.out").open("w") as out:  # as docs/dvc-mlflow.md runs it
        proc = subprocess.Popen(["caprl", "with-services", "dvc", "repro", "--quiet"], cwd=work, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    yield work, build_plan(params), proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def dvc_run(dvc_started: tuple[Path, Any, subprocess.Popen]) -> tuple[Path, Any]:
    """`dvc repro` of :func:`dvc_started`, finished: its folder and plan."""
    work, plan, proc = dvc_started
    code = proc.wait(timeout=900)
    assert code == 0, f"dvc repro failed:\n{(work / 'dvc-repro.out').read_text()[-6000:]}"
    return work, plan


def test_dvc_repro_runs_the_same_stages_with_the_same_metrics(snakemake_run: Path, dvc_run: tuple[Path, Any]) -> None:
    """Same params and seed, in another directory, through DVC: identical metrics (CPU determinism)."""
    work, dvc_plan = dvc_run
    assert dvc_plan.retrieved("synthetic")  # the PSST runs and their retrieval stages are in
    scores = all_scores(snakemake_run)
    # the git state of the copies, and of this checkout (an edit during the test run marks it dirty)
    strip = lambda s: {k: v for k, v in s.items() if k not in ("provenance", "code_version")}  # noqa: E731
    assert {k: strip(v) for k, v in all_scores(work, dvc_plan).items()} == \
        {key: strip(scores[key]) for key in all_scores(work, dvc_plan)}
    for job in dvc_plan.retrieved("synthetic") + dvc_plan.gold_retrieved("synthetic"):  # the listener ranks identically
        path = job.result("results/{dataset}/{run}/retrieval.json")
        assert (work / path).read_text() == (snakemake_run / path).read_text()
    # the DVC table has fewer runs: each of its lines is the Snakemake table's line, in the same order
    dvc_lines = (work / "results" / "tables" / "synthetic_main.md").read_text().splitlines()
    snakemake_lines = (snakemake_run / "results" / "tables" / "synthetic_main.md").read_text().splitlines()
    assert dvc_lines == [line for line in snakemake_lines if line in set(dvc_lines)]
    assert all(any(f"[{job.run}]" in line for line in dvc_lines) for job in dvc_plan.evaluated("synthetic"))


def test_a_clone_that_pulls_from_dvc_retrains_nothing_and_runs_experiments(dvc_run: tuple[Path, Any],
                                                                           tmp_path: Path) -> None:
    """git clone + dvc pull from a local remote + the main command: no job runs; then
    `dvc exp run -S` changes one run's decoding, `dvc metrics diff` shows its new scores and
    `dvc plots show` draws the learning curves."""
    work, _ = dvc_run
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    run(["dvc", "remote", "add", "-d", "local", str(tmp_path / "remote")], work)
    run(["dvc", "push", "--quiet"], work)
    run(["git", "add", "-A"], work)
    run([*git, "commit", "-qm", "results"], work)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(work), str(clone)], tmp_path)
    run(["dvc", "pull", "--quiet"], clone)
    proc = run(["snakemake", "--cores", "2", "all_tables"], clone)
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "up to date" in run(["dvc", "status"], clone).stdout
    proc = run(["dvc", "exp", "run", "-S", "+runs.fc-scst.decode.beam_size=1"], clone)
    ran = {line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage")}
    assert "synthetic-evaluate-fc-scst" in ran and not any("train-fc-xe" in s for s in ran), ran
    diff = run(["dvc", "metrics", "diff", "--json"], clone).stdout
    assert "results/synthetic/fc-scst/scores.json" in json.loads(diff)
    plots = json.loads(run(["dvc", "plots", "show", "--json", "-o", str(tmp_path / "plots")], clone).stdout)
    assert "results/figures/synthetic/curves/fc-scst.csv" in plots["data"]


@pytest.mark.full  # CI: test_datasets_dag's smaller run (two datasets, 3 runs; `dvc commit` is ~1 s a stage)
def test_dvc_lock_records_a_snakemake_run(snakemake_run: Path, tmp_path: Path) -> None:
    """After the main command, `caprl dvc-lock`: `dvc status` tells the truth (every stage up to
    date) and Snakemake still has nothing to do."""
    check_dvc_lock(snakemake_run, tmp_path / "lock")


def check_dvc_lock(snakemake_run: Path, work: Path) -> set[str]:
    """`caprl dvc-lock` in a copy of a Snakemake run: `dvc status` up to date after it (changed
    before), `snakemake -n` has nothing to do; the stages dvc.lock records."""
    shutil.copytree(snakemake_run, work, symlinks=True)  # copy2: modification times kept
    assert "changed" in run(["dvc", "status"], work).stdout  # no dvc.lock yet: every stage looks new
    run(["caprl", "dvc-lock"], work)
    assert "up to date" in run(["dvc", "status"], work).stdout
    proc = run(["snakemake", "-n", "all_tables"], work)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    return set(yaml.safe_load((work / "dvc.lock").read_text())["stages"])


def test_report_holds_every_table_and_figure(snakemake_run: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`snakemake --report`: every table and figure under its dataset and paper; MLflow's compare
    view of two methods: their params and test metrics side by side (with `pytest --full` or
    $CAPRL_REPORT_SCREENS, screenshots checked where Chromium is or can be installed); the
    learning curves hold the histories."""
    check_curves(snakemake_run)
    out = Path(os.environ.get("CAPRL_REPORT_SCREENS", tmp_path))
    screens = full_run(request.config) or "CAPRL_REPORT_SCREENS" in os.environ
    check_report(snakemake_run, out / "report.png", screens)
    check_mlflow_compare(snakemake_run, out / "mlflow_compare.png", ("synthetic/fc-xe", "synthetic/fc-scst"), screens)
