"""MLflow tracking that never stops training.

One MLflow run per training job, holding everything a comparison needs: the run's params
(options flattened), its training curves, its best validation score and, once evaluated, its
test metrics (``test/<metric>``; retrieval's ``test/R_at_K``). The evaluation and retrieval
jobs are nested runs under it (``mlflow.parentRunId``) with their own files; an RL run's
training run names the runs it started from (``caprl.init.<role>``). Every run carries the
git commit, dirty flag and source (MLflow's ``mlflow.source.*`` tags) and its job name
(``caprl.job``), and its URL is logged.

The store is ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///mlflow.db`` in the working
directory (artifacts in ``mlartifacts/``). If MLflow fails (a dead or slow server, a locked
database) the job logs one warning and goes on: a dead server costs a connect timeout
(``CONNECT_TIMEOUT``), a slow one a request timeout, then tracking is off for the job.
Everything is also in the job's own files, from which ``caprl mlflow-sync`` logs later.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # MLflow 3: not the GenAI view
CONNECT_TIMEOUT = 2.0  # seconds to reach an HTTP tracking server before giving up for this job
# MLflow's own HTTP client retries ~7 times with backoff (minutes against a dead server);
# a user's explicit setting wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
_unavailable: list[str] = []  # why MLflow failed in this process: later trackers do not retry


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"run": {"options": {"lr": 1}}}`` -> ``{"run.options.lr": "1"}`` (lists as text)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:500]
    return flat


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def provenance() -> dict[str, str]:
    """The code's git commit, dirty flag and origin URL (credentials removed); empty outside git.

    The source tree of the installed caprl package is asked first (the code that ran), then
    the working directory.
    """
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        commit = _git("rev-parse", "HEAD", cwd=root)
        if commit:
            status = _git("status", "--porcelain", "--untracked-files=no", cwd=root)
            info = {"git_commit": commit, "git_dirty": "true" if status else "false"}
            url = _git("remote", "get-url", "origin", cwd=root)
            if url and not url.startswith(("/", ".", "file:")):  # a local path is a machine path
                parts = urlsplit(url)
                info["git_repo_url"] = urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.scheme else url
            return info
    return {}


def source_tags(stage: str) -> dict[str, str]:
    """MLflow's context tags for a ``caprl <stage>`` job (set by hand: the entry point is a
    console script outside the repository, so MLflow's own git detection finds nothing)."""
    info = provenance()
    tags = {"mlflow.source.name": f"caprl {stage}", "mlflow.source.type": "LOCAL", "mlflow.user": _user(),
            "caprl.stage": stage}
    if info:
        tags.update({"mlflow.source.git.commit": info["git_commit"], "caprl.git.dirty": info["git_dirty"]})
        if "git_repo_url" in info:
            tags["mlflow.source.git.repoURL"] = info["git_repo_url"]
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """Where the run is shown: the server's page, or ``mlflow ui``'s default address for a file store."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}"
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}"
    return f"http://127.0.0.1:5000/{page} (after `mlflow ui --backend-store-uri {uri}`)"


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


class Tracker:
    """A best-effort MLflow run: ``with Tracker(...) as t: t.log_metrics(...)``.

    ``run_id`` reopens an existing run (a resumed training job; ``keep_status``: only add to
    it); ``parent_run_id`` nests the run under another (an evaluation under its training run).
    """

    def __init__(self, experiment: str, run_name: str, tags: dict[str, str] | None = None,
                 run_id: str | None = None, enabled: bool = True, stage: str = "",
                 parent_run_id: str | None = None, keep_status: bool = False) -> None:
        self.experiment, self.run_name, self.run_id = experiment, run_name, run_id
        self.tags = {**source_tags(stage or run_name.rsplit("/", 1)[-1]), "caprl.job": run_name, **(tags or {})}
        if parent_run_id:
            self.tags["mlflow.parentRunId"] = parent_run_id
        self.enabled = enabled  # False in DDP processes other than 0: one MLflow run per job
        self.keep_status = keep_status  # adding to a finished run (caprl mlflow-sync): leave its status
        self.experiment_id = ""
        self._client: Any = None

    def __enter__(self) -> "Tracker":
        if not self.enabled:
            return self
        if _unavailable:
            log.info("MLflow not used by this job (%s)", _unavailable[0])
            return self
        try:
            self._start()
        except Exception as exc:  # MLflow must never stop a job; say so once
            self._fail("start", exc)
        return self

    def _start(self) -> None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        uri = tracking_uri()
        why = reachable(uri)
        if why:
            raise ConnectionError(why)
        from filelock import FileLock
        from mlflow.tracking import MlflowClient

        lock = FileLock(str(Path.cwd() / ".mlflow.lock")) if uri.startswith("sqlite:") else None
        if lock is not None:
            lock.acquire(timeout=120)  # parallel jobs: one creates the schema and the experiment
        try:
            client = MlflowClient(tracking_uri=uri)
            self.experiment_id = experiment_id(client, self.experiment, uri)
            if self.run_id is None:
                self.run_id = client.create_run(self.experiment_id, run_name=self.run_name, tags=self.tags).info.run_id
            elif not self.keep_status:
                client.update_run(self.run_id, status="RUNNING")  # a resumed training job
        finally:
            if lock is not None:
                lock.release()
        self._client = client
        log.info("MLflow run %s: %s", self.run_name, run_url(uri, self.experiment_id, self.run_id))

    def _fail(self, what: str, exc: BaseException) -> None:
        reason = f"MLflow {what} failed ({type(exc).__name__}: {exc})"
        _unavailable.append(reason)
        log.warning("%s; going on without tracking: `caprl mlflow-sync` logs this job later from its files", reason)
        self._client = None

    @property
    def active(self) -> bool:
        return self._client is not None

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._client is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._fail(what, exc)
            return None

    def log_params(self, params: dict[str, Any]) -> None:
        if self._client is None:
            return
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self._call("log_params", self._client.log_batch, self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int | None = None, run_id: str | None = None) -> None:
        """Log to this run, or (``run_id``) to another: an evaluation's test metrics into its training run."""
        if self._client is None:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k.replace("@", "_at_"), float(v), now, step or 0) for k, v in metrics.items()]
        self._call("log_metrics", self._client.log_batch, run_id or self.run_id, metrics=items)

    def set_tags(self, tags: dict[str, str], run_id: str | None = None) -> None:
        if self._client is None:
            return
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        self._call("set_tags", self._client.log_batch, run_id or self.run_id, tags=items)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        if self._client is not None and Path(path).is_file():
            self._call("log_artifact", self._client.log_artifact, self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._client is not None:
            self._call("log_text", self._client.log_text, self.run_id, text, artifact_file)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._client is not None and not self.keep_status:
            status = "FINISHED" if exc_type is None else "FAILED"
            if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
                status = "KILLED"
            self._call("set_terminated", self._client.set_terminated, self.run_id, status)
