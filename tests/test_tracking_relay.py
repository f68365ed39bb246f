"""The MLflow relay: jobs of one local run log through one MLflow client (caprl.tracking.store).

Real relay processes (started as the Snakefile starts them), real `python` jobs using
caprl.tracking.Tracker, real MLflow on sqlite read back with MLflow's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from caprl.runtime import socket_service
from caprl.tracking import store as tracking_store

JOB = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
from caprl.tracking import Tracker
Path("notes.txt").write_text("a file of the job")
with Tracker("caprl", "synthetic/fc-xe/train", tags={"caprl.kind": "test"}) as t:
    t.log_params({"run": {"options": {"lr": 0.01}}, "seed": 1})
    for step in (1, 2):
        t.log_metrics({"val/CIDEr-D": 0.5 * step, "R@10": 0.25}, step=step)
    t.set_tags({"best.epoch": 2})
    t.log_text("hello", "texts/hello.txt")
    t.log_artifact("notes.txt")
    active = t.active
print(json.dumps({"run_id": t.run_id, "active": active, "mlflow_imported": "mlflow" in sys.modules}))
"""


def job(cwd: Path, uri: str, relay: str | None, script: str = JOB) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != tracking_store.SOCKET_ENV}
    env["MLFLOW_TRACKING_URI"] = uri
    if relay:
        env[tracking_store.SOCKET_ENV] = relay
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def relay_at(cwd: Path, uri: str, tag: str) -> Iterator[str]:
    path = f"/tmp/caprl-rt-{os.getpid()}-{tag}.sock"
    here = Path.cwd()
    os.chdir(cwd)  # the relay writes from the directory it is started in, as Snakemake's hook starts it
    try:
        proc = tracking_store.start(path, uri, parent_pid=os.getpid())
    finally:
        os.chdir(here)
    yield path
    assert socket_service.stop(path, tracking_store.SERVER_MODULE, what=tracking_store.WHAT)
    socket_service.stop_process(proc)
    assert proc.returncode == 0 and not os.path.lexists(path)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("relay")


@pytest.fixture(scope="module")
def relay(work: Path) -> Iterator[str]:
    yield from relay_at(work, "sqlite:///mlflow.db", "a")


def read_run(uri: str, run_id: str):  # noqa: ANN201 (an MLflow Run)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run(run_id)


def test_a_job_logs_everything_through_the_relay_without_importing_mlflow(work: Path, relay: str) -> None:
    out, _ = job(work, "sqlite:///mlflow.db", relay)
    assert out["active"] and not out["mlflow_imported"]
    client, run = read_run(f"sqlite:///{work / 'mlflow.db'}", out["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "synthetic/fc-xe/train"
    assert run.data.params == {"run.options.lr": "0.01", "seed": "1"}
    assert run.data.metrics == {"val/CIDEr-D": 1.0, "R_at_10": 0.25}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/CIDEr-D")] == [(1, 0.5), (2, 1.0)]
    assert run.data.tags["caprl.kind"] == "test" and run.data.tags["best.epoch"] == "2"
    assert run.data.tags["caprl.job"] == "synthetic/fc-xe/train" and "mlflow.source.name" in run.data.tags
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"notes.txt", "texts"}
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert (work / "mlartifacts").is_dir()  # the job's working directory's store, as without the relay


def test_a_relay_that_writes_elsewhere_or_is_gone_is_not_used(work: Path, relay: str, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'other.db'}"
    out, log = job(work, other, relay)  # another store: the job talks to MLflow itself
    assert out["active"] and out["mlflow_imported"] and "MLflow relay not used" in log
    assert read_run(other, out["run_id"])[1].data.params["seed"] == "1"
    out, log = job(work, "sqlite:///mlflow.db", f"/tmp/caprl-rt-{os.getpid()}-none.sock")  # nothing answers
    assert out["active"] and out["mlflow_imported"] and "MLflow relay not used" in log
    assert read_run(f"sqlite:///{work / 'mlflow.db'}", out["run_id"])[1].info.status == "FINISHED"


def test_an_mlflow_failure_in_the_relay_turns_tracking_off_for_the_job(work: Path, relay: str) -> None:
    script = ("import json, logging\nfrom caprl.tracking import Tracker\nlogging.basicConfig(level=logging.INFO)\n"
              "with Tracker('caprl', 'synthetic/x/train', run_id='0' * 32) as t:\n"  # no such run to reopen
              "    t.log_metrics({'m': 1.0})\n"
              "print(json.dumps({'active': t.active}))\n")
    out, log = job(work, "sqlite:///mlflow.db", relay, script)
    assert not out["active"] and "going on without tracking" in log and "MLflow relay could not answer" in log
    out, _ = job(work, "sqlite:///mlflow.db", relay)  # the relay goes on serving
    assert out["active"]


def test_start_shared_exports_the_socket_and_stop_shared_unsets_it(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracking_store.SOCKET_ENV, raising=False)
    monkeypatch.chdir(work)
    path = tracking_store.start_shared()
    try:
        assert path == socket_service.workflow_socket_path("mlflow") and os.environ[tracking_store.SOCKET_ENV] == path
        assert tracking_store.relay_for(tracking_store.tracking_uri()) is not None
    finally:
        tracking_store.stop_shared()
    assert tracking_store.SOCKET_ENV not in os.environ and not os.path.lexists(path)
