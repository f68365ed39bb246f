"""MLflow as researchers compare runs: one training run holds params, curves and test metrics;
evaluation nested under it; init runs linked; source tags; a dead or slow server costs a job
seconds, and `caprl mlflow-sync` logs later what it could not. Real MLflow (sqlite), real
`caprl` subprocesses, a real TCP port nobody listens on and a real server that never answers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import TINY, default_params, merge
from pipeline_data import DatasetPaths, build_dataset, caprl_command

RUNS = {"fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 2}},
        "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DatasetPaths:
    work = tmp_path_factory.mktemp("tracking")
    params = merge(default_params(), TINY)
    params["synthetic"].update(n_train=40, n_val=8, n_test=8)
    params["runs"] = RUNS
    params["datasets"]["synthetic"]["runs"] = list(RUNS)
    params["evaluate"]["metrics"] = ["bleu", "cider_d"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    return build_dataset(work, params, references=["test"], env=env)


def dead_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(data: DatasetPaths, run: str, uri: str) -> str:
    """``caprl train`` as the workflow runs it (the plan's paths); its log."""
    from caprl.workflow.plan import CHECKPOINT, HISTORY, STATE_DIR

    paths = {p: p.format(dataset="synthetic", run=run) for p in (CHECKPOINT, HISTORY, STATE_DIR)}
    log = f"logs/train-{run}.log"
    init = ["--init", f"model={CHECKPOINT.format(dataset='synthetic', run='fc-xe')}"] if run == "fc-scst" else []
    cmd = caprl_command("train", data.params, "--log", log, "--dataset", "synthetic", "--run", run, *data.train_args(),
                        *init, "--checkpoint", paths[CHECKPOINT], "--history", paths[HISTORY],
                        "--state-dir", paths[STATE_DIR])
    proc = subprocess.run(cmd, cwd=data.workdir, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (data.workdir / log).read_text()


def caprl(data: DatasetPaths, uri: str, stage: str, *args: str) -> str:
    proc = subprocess.run(caprl_command(stage, data.params, *args), cwd=data.workdir, capture_output=True, text=True,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def runs_by_job(uri: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("caprl")
    return {r.data.tags["caprl.job"]: r for r in client.search_runs([exp.experiment_id])}


@pytest.fixture(scope="module")
def tracked(dataset: DatasetPaths) -> dict[str, Any]:
    """fc-xe trained with the server down (then synced), fc-scst trained and evaluated with it up."""
    uri = f"sqlite:///{dataset.workdir / 'mlflow.db'}"
    dead_log = train(dataset, "fc-xe", f"http://127.0.0.1:{dead_port()}")
    synced = caprl(dataset, uri, "mlflow-sync")
    scst_log = train(dataset, "fc-scst", uri)
    from caprl.workflow.plan import CAPTIONS, CHECKPOINT, EXAMPLES, SCORES

    files = {p: p.format(dataset="synthetic", run="fc-scst") for p in (CHECKPOINT, CAPTIONS, SCORES, EXAMPLES)}
    caprl(dataset, uri, "evaluate", "--log", "logs/evaluate.log", "--dataset", "synthetic", "--run", "fc-scst",
          "--checkpoint", files[CHECKPOINT], *dataset.train_args()[:8], "--refs", str(dataset.references["test"]),
          "--out-captions", files[CAPTIONS], "--out-scores", files[SCORES], "--out-examples", files[EXAMPLES])
    resynced = caprl(dataset, uri, "mlflow-sync")
    return {"uri": uri, "dead_log": dead_log, "synced": synced,
            "resynced": resynced, "scst_log": scst_log, "scores": json.loads((dataset.workdir / files[SCORES]).read_text())}


def test_a_dead_server_costs_a_job_seconds_and_sync_logs_it_later(tracked: dict[str, Any]) -> None:
    # the job went on (no hang: test_an_unanswering_server_costs_seconds_not_minutes)
    assert "going on without tracking" in tracked["dead_log"] and "mlflow-sync" in tracked["dead_log"]
    runs = runs_by_job(tracked["uri"])
    xe = runs["synthetic/fc-xe/train"]  # made by `caprl mlflow-sync` from history.json
    assert xe.data.tags["caprl.logged_from"] == "files" and xe.data.params["run.options.epochs"] == "2"
    assert "val/CIDEr-D" in xe.data.metrics and "train/epoch_loss" in xe.data.metrics
    assert {"train/lr", "best/epoch"} <= set(xe.data.metrics) and "start" not in xe.data.metrics
    assert "synthetic/fc-xe/train" in tracked["synced"]
    assert "logged 0 job(s)" in tracked["resynced"]  # nothing twice


def test_training_run_holds_params_test_metrics_links_and_files(tracked: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracked["uri"])
    assert client.get_experiment_by_name("caprl").tags["mlflow.experimentKind"] == "custom_model_development"
    runs = runs_by_job(tracked["uri"])
    train, evaluation = runs["synthetic/fc-scst/train"], runs["synthetic/fc-scst/evaluate"]
    assert evaluation.data.tags["mlflow.parentRunId"] == train.info.run_id
    assert train.data.metrics["test/CIDEr-D"] == pytest.approx(tracked["scores"]["metrics"]["CIDEr-D"])
    assert train.data.params["run.method"] == "scst" and train.data.params["run.init.model"] == "fc-xe"
    # fc-xe's job had no MLflow: its name links fc-scst to it, mlflow-sync added the run id
    assert train.data.tags["caprl.init.model"] == "synthetic/fc-xe/train"
    assert train.data.tags["caprl.init.model.run_id"] == runs["synthetic/fc-xe/train"].info.run_id
    commit = tracked["scores"]["provenance"]["git_commit"]  # the package's source tree is a git checkout
    assert len(commit) == 40 and train.data.tags["mlflow.source.git.commit"] == commit
    assert {"caprl.git.dirty", "mlflow.source.name", "mlflow.user"} <= set(train.data.tags)
    assert not any(v.startswith("{") for v in {**evaluation.data.tags, **evaluation.data.params}.values())
    # fc-scst starts from fc-xe: its starting weights validated at step 0, the selected epoch logged
    assert [m.step for m in client.get_metric_history(train.info.run_id, "val/CIDEr-D")][0] == 0
    assert "best/epoch" in train.data.metrics and "start" not in train.data.metrics
    artifacts = {a.path for a in client.list_artifacts(train.info.run_id)}
    assert {"config.yaml", "history.json", "train-fc-scst.log"} <= artifacts
    assert f"#/experiments/{train.info.experiment_id}/runs/{train.info.run_id}" in tracked["scst_log"]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A server that accepts connections and never answers (a hung tracking server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("server", ["dead", "silent"])
def test_an_unanswering_server_costs_seconds_not_minutes(server: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    """One bounded wait, then tracking is off: the connect timeout (dead) or one request's timeout
    (silent) of caprl.tracking.store, never MLflow's defaults (7 retries with back-off, 120 s a
    request: minutes). ~2-4 s alone; the 60 s bound is a hang's, not a speed check (the parallel
    tests' load stretches the lazy imports inside the timed block)."""
    from caprl.tracking.store import CONNECT_TIMEOUT, HTTP_DEFAULTS

    port = dead_port() if server == "dead" else request.getfixturevalue("silent_server")
    script = ("import time\nimport mlflow.tracking\nfrom caprl.tracking import Tracker\n"
              "started = time.monotonic()\n"
              "with Tracker('caprl', 'synthetic/x/train') as t:\n"
              "    t.log_params({'a': 1}); t.log_metrics({'m': 1.0}); t.log_text('x', 'x.txt')\n"
              "    assert not t.active\n"
              "print(f'tracking took {time.monotonic() - started:.3f} s')\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("going on without tracking") == 1, proc.stderr[-2000:]
    waited = (f"within {CONNECT_TIMEOUT:g} s" if server == "dead"
              else f"read timeout={HTTP_DEFAULTS['MLFLOW_HTTP_REQUEST_TIMEOUT']}")
    assert waited in proc.stderr, proc.stderr[-2000:]
    assert float(proc.stdout.split("tracking took ")[1].split()[0]) < 60, proc.stdout


def test_a_run_retrained_with_other_parameters_gets_a_new_mlflow_run(tracked: dict[str, Any],
                                                                     dataset: DatasetPaths, tmp_path: Path) -> None:
    """A researcher changes a run's options and trains it again: its last.pt was written with the
    old parameters, so training starts afresh, and it logs into a new MLflow run (MLflow refuses
    to change the parameters of the old one, which used to turn tracking off for the job)."""
    import dataclasses
    import shutil

    import yaml
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    shutil.copytree(dataset.workdir, work)  # the trained runs and their database (the data files are shared)
    params = yaml.safe_load(dataset.params.read_text())
    params["runs"]["fc-scst"]["options"] = {"n_samples": 3}
    changed = work / "params-changed.yaml"
    changed.write_text(yaml.safe_dump(params))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    log = train(dataclasses.replace(dataset, workdir=work, params=changed), "fc-scst", uri)
    assert "written with other parameters: starting this run afresh" in log
    assert "log_params failed" not in log and "going on without tracking" not in log

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("caprl")
    runs = client.search_runs([exp.experiment_id], "tags.`caprl.job` = 'synthetic/fc-scst/train'",
                              order_by=["attributes.start_time ASC"])
    assert len(runs) == 2, [r.info.run_id for r in runs]
    old, new = runs
    assert old.data.params["run.options.n_samples"] != "3" and new.data.params["run.options.n_samples"] == "3"
    from caprl.models.checkpoint import mlflow_run_id
    from caprl.workflow.plan import CHECKPOINT

    assert new.data.metrics["best/epoch"] >= 0
    original = dataset.workdir / CHECKPOINT.format(dataset="synthetic", run="fc-scst")  # the first training's
    assert mlflow_run_id(original) == old.info.run_id and mlflow_run_id(work / original.relative_to(dataset.workdir)) == new.info.run_id


START_TOGETHER = """
import sys, time
from caprl.tracking import Tracker
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
with Tracker("caprl", f"job{sys.argv[1]}/evaluate", stage="evaluate") as tracker:
    tracker.log_metrics({"test/CIDEr-D": 1.0})
print(tracker.active)
"""


def test_jobs_opening_a_new_store_at_once_all_get_their_runs(tmp_path: Path) -> None:
    """The workflow's first jobs start together on a store nobody has opened yet: each one's
    MLflow creates the SQLite schema unless another already holds the lock, so none loses its run
    (unlocked, all but one failed on "table alembic_version already exists")."""
    import time

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    start = f"{time.time() + 6:.3f}"  # after every process has imported MLflow
    procs = [subprocess.Popen([sys.executable, "-c", START_TOGETHER, str(i), start], cwd=tmp_path,
                              env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [out.strip() for out, _ in outputs] == ["True"] * 4, [err[-2000:] for _, err in outputs]
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("caprl")
    runs = MlflowClient(tracking_uri=uri).search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"job{i}/evaluate" for i in range(4)]
    assert (tmp_path / "store" / "mlflow.db.lock").exists()  # beside the store, not in the job's folder
