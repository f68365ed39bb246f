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
(``tracking_store.CONNECT_TIMEOUT``), a slow one a request timeout, then tracking is off for
the job. Everything is also in the job's own files, from which ``caprl mlflow-sync`` logs later.
Every call goes through MLflow's own client in the job (:mod:`caprl.tracking.store`).
"""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from caprl.tracking.store import Store, tracking_uri

log = logging.getLogger(__name__)

_unavailable: list[str] = []  # why MLflow failed in this process: later trackers do not retry


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
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
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


def params_tags(params: Mapping[str, Any]) -> dict[str, str]:
    """``tracking.tags``: what every MLflow run of these params carries (a claims seed's: its paper,
    claims configuration and seed, so the MLflow UI finds a claim's runs across its seeds)."""
    return {str(k): str(v) for k, v in params["tracking"].get("tags", {}).items()}


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
        self._client: Store | None = None

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
        uri = tracking_uri()
        self._client = Store(uri)  # ConnectionError: an HTTP server that does not answer
        self.experiment_id, self.run_id = self._client.open_run(self.experiment, self.run_name, self.tags, self.run_id,
                                                                self.keep_status)
        log.info("MLflow run %s: %s", self.run_name, run_url(uri, self.experiment_id, self.run_id))

    def _fail(self, what: str, exc: BaseException) -> None:
        reason = f"MLflow {what} failed ({type(exc).__name__}: {exc})"
        _unavailable.append(reason)
        log.warning("%s; going on without tracking: `caprl mlflow-sync` logs this job later from its files", reason)
        self._client = None

    @property
    def active(self) -> bool:
        return self._client is not None

    def _call(self, what: str, op: str, *args: Any, **kwargs: Any) -> Any:
        """The store's ``op`` (a Store method); a failure turns tracking off for the job."""
        if self._client is None:
            return None
        try:
            return getattr(self._client, op)(*args, **kwargs)
        except Exception as exc:
            self._fail(what, exc)
            return None

    def log_params(self, params: dict[str, Any]) -> None:
        items = list(flatten(params).items())
        for i in range(0, len(items), 100):
            self._call("log_params", "log_batch", self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int | None = None, run_id: str | None = None) -> None:
        """Log to this run, or (``run_id``) to another: an evaluation's test metrics into its training run."""
        now = int(time.time() * 1000)
        items = [(k.replace("@", "_at_"), float(v), now, step or 0) for k, v in metrics.items()]
        self._call("log_metrics", "log_batch", run_id or self.run_id, metrics=items)

    def set_tags(self, tags: dict[str, str], run_id: str | None = None) -> None:
        items = [(k, str(v)) for k, v in tags.items()]
        self._call("set_tags", "log_batch", run_id or self.run_id, tags=items)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        if self._client is not None and Path(path).is_file():
            self._call("log_artifact", "log_artifact", self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._client is not None:
            self._call("log_text", "log_text", self.run_id, text, artifact_file)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._client is not None and not self.keep_status:
            status = "FINISHED" if exc_type is None else "FAILED"
            if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
                status = "KILLED"
            self._call("set_terminated", "set_terminated", self.run_id, status)
