"""MLflow tracking that never stops training.

One MLflow run per training or evaluation job. The tracking store is
``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlflow.db`` with artifacts in
``<cwd>/mlartifacts``. If MLflow fails (unreachable server, locked database), the job
logs one warning and goes on: every metric is also in the job's own output files, from
which ``caprl`` can be re-run or the numbers logged later.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:500]
    return flat


class Tracker:
    """A best-effort MLflow run: ``with Tracker(...) as t: t.log_metrics(...)``."""

    def __init__(self, experiment: str, run_name: str, tags: dict[str, str] | None = None,
                 run_id: str | None = None, enabled: bool = True) -> None:
        self.experiment, self.run_name, self.tags, self.run_id = experiment, run_name, tags or {}, run_id
        self.enabled = enabled  # False in DDP processes other than 0: one MLflow run per job
        self._client: Any = None

    def __enter__(self) -> "Tracker":
        if not self.enabled:
            return self
        try:
            self._start()
        except Exception as exc:  # MLflow must never stop a job; say so once
            log.warning("MLflow unavailable (%s: %s); going on without tracking", type(exc).__name__, exc)
            self._client = None
        return self

    def _start(self) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from filelock import FileLock
        from mlflow.tracking import MlflowClient

        uri = tracking_uri()
        lock = FileLock(str(Path.cwd() / ".mlflow.lock")) if uri.startswith("sqlite:") else None
        if lock is not None:
            lock.acquire(timeout=120)  # parallel jobs: one creates the schema and the experiment
        try:
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                artifacts = (Path.cwd() / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
                exp_id = client.create_experiment(self.experiment, artifact_location=artifacts)
            else:
                exp_id = exp.experiment_id
            if self.run_id is None:
                self.run_id = client.create_run(exp_id, run_name=self.run_name, tags=self.tags).info.run_id
        finally:
            if lock is not None:
                lock.release()
        self._client = client

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        if self._client is None:
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            log.warning("MLflow %s failed (%s: %s); tracking disabled for this job", what, type(exc).__name__, exc)
            self._client = None

    def log_params(self, params: dict[str, Any]) -> None:
        if self._client is None:
            return
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self._call("log_params", self._client.log_batch, self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._client is None:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k.replace("@", "_at_"), float(v), now, step or 0) for k, v in metrics.items()]
        self._call("log_metrics", self._client.log_batch, self.run_id, metrics=items)

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        if self._client is not None:
            self._call("log_artifact", self._client.log_artifact, self.run_id, str(path))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._client is not None:
            status = "FINISHED" if exc_type is None else "FAILED"
            if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
                status = "KILLED"
            self._call("set_terminated", self._client.set_terminated, self.run_id, status)
