"""Where a :class:`caprl.tracking.Tracker`'s calls go: MLflow's own client in the job, behind a
small interface of plain values (``Store``), with a connect timeout for HTTP stores and no retries
(a dead server costs a job seconds, not minutes)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # MLflow 3: not the GenAI view
CONNECT_TIMEOUT = 2.0  # seconds to reach an HTTP tracking server before giving up for this job
# MLflow's own HTTP client retries ~7 times with backoff (minutes against a dead server);
# a user's explicit setting wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
Metric = tuple[str, float, int, int]  # key, value, timestamp (ms), step


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def reachable(uri: str) -> str | None:
    """None if an HTTP tracking server accepts a connection (or the store is not HTTP), else why not."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), timeout=CONNECT_TIMEOUT):
            return None
    except OSError as exc:
        return f"cannot connect to {parts.hostname}:{port} within {CONNECT_TIMEOUT:g} s ({exc})"


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The experiment's id, created (kind: model training) if missing; an old one gets the kind tag."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        artifacts = (Path.cwd() / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        return client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_KIND)
    if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND["mlflow.experimentKind"]:
        client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND["mlflow.experimentKind"])
    return exp.experiment_id


def schema_lock(uri: str) -> Any:
    """A lock beside an SQLite store's file (parallel jobs: one creates the schema and the
    experiment, the others wait; unlocked, all but one fail on "table already exists");
    no lock for a server, which serialises its own writes."""
    from contextlib import nullcontext

    from filelock import FileLock

    if not uri.startswith("sqlite:"):
        return nullcontext()
    db = Path(urlsplit(uri).path.removeprefix("/")) if uri.startswith("sqlite:///") else None
    lock = db.with_name(db.name + ".lock") if db and db.name else Path.cwd() / ".mlflow.lock"
    return FileLock(str(lock), timeout=120)


class Store:
    """MLflow's own client on the store at ``uri``; plain values in, plain values out."""

    def __init__(self, uri: str) -> None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        why = reachable(uri)
        if why:
            raise ConnectionError(why)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._lock = schema_lock(uri)
        with self._lock:  # MLflow creates or migrates an SQLite schema on opening it
            self.client = MlflowClient(tracking_uri=uri)

    def open_run(self, experiment: str, run_name: str, tags: dict[str, str], run_id: str | None,
                 keep_status: bool) -> tuple[str, str]:
        """(experiment id, run id): a new run, or ``run_id`` reopened (RUNNING unless ``keep_status``)."""
        with self._lock:
            exp = experiment_id(self.client, experiment, self.uri)
            if run_id is None:
                run_id = self.client.create_run(exp, run_name=run_name, tags=tags).info.run_id
            elif not keep_status:
                self.client.update_run(run_id, status="RUNNING")  # a resumed training job
        return exp, str(run_id)

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[tuple[str, str]] = (),
                  tags: Sequence[tuple[str, str]] = ()) -> None:
        from mlflow.entities import Metric as MlflowMetric
        from mlflow.entities import Param, RunTag

        self.client.log_batch(run_id, metrics=[MlflowMetric(k, float(v), int(t), int(s)) for k, v, t, s in metrics],
                              params=[Param(k, v) for k, v in params], tags=[RunTag(k, v) for k, v in tags])

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None) -> None:
        self.client.log_artifact(run_id, path, artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def set_terminated(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
