"""Where a :class:`caprl.tracking.Tracker`'s calls go: MLflow's own client, or the MLflow relay.

A job that talks to MLflow itself spends ~3.5 s of CPU before its first call (importing
MLflow, ~2 s; opening the store, ~1.5 s), and a demo run has ~100 such jobs. The relay is one
process per local Snakemake run (started in the Snakefile's ``onstart``, its socket exported
in ``$CAPRL_MLFLOW_RELAY``; :mod:`caprl.runtime.socket_service` runs it) that holds one
:class:`DirectStore` and makes the jobs' calls for them, one at a time, in their order. A job
never imports MLflow then. It uses the relay only if the relay writes to the same store (the
same tracking URI from the same working directory, where a relative sqlite path and the
``mlartifacts/`` folder lie), and talks to MLflow itself when no relay answers.

Requests (besides ``ping`` / ``shutdown``): ``{"op": "info"}`` -> ``{"uri", "cwd"}``; ``open_run``
(experiment, run_name, tags, run_id, keep_status) -> ``{"experiment_id", "run_id"}``; ``log_batch``
(run_id, metrics [[key, value, ms, step]], params [[key, value]], tags [[key, value]]);
``log_artifact`` (run_id, path (absolute), artifact_path); ``log_text`` (run_id, text,
artifact_file); ``set_terminated`` (run_id, status). A failed MLflow call is answered with its
error, which the job's Tracker treats as it treats a failure of its own client.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from caprl.runtime import socket_service as service
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SOCKET_ENV = "CAPRL_MLFLOW_RELAY"
SERVER_MODULE = "caprl.tracking.store"
WHAT = "MLflow relay"
IDLE_TIMEOUT_S = 3600.0
REQUEST_TIMEOUT_S = 180.0  # the relay's queue, its store's sqlite lock (up to 120 s) and a first MLflow import
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # MLflow 3: not the GenAI view
CONNECT_TIMEOUT = 2.0  # seconds to reach an HTTP tracking server before giving up for this job
# MLflow's own HTTP client retries ~7 times with backoff (minutes against a dead server);
# a user's explicit setting wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
Metric = tuple[str, float, int, int]  # key, value, timestamp (ms), step


class Store(Protocol):
    """What a Tracker calls; plain values only, so that a job needs no MLflow import."""

    def open_run(self, experiment: str, run_name: str, tags: dict[str, str], run_id: str | None,
                 keep_status: bool) -> tuple[str, str]: ...
    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[tuple[str, str]] = (),
                  tags: Sequence[tuple[str, str]] = ()) -> None: ...
    def log_artifact(self, run_id: str, path: str, artifact_path: str | None) -> None: ...
    def log_text(self, run_id: str, text: str, artifact_file: str) -> None: ...
    def set_terminated(self, run_id: str, status: str) -> None: ...


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


class DirectStore:
    """MLflow's own client on the store at ``uri`` (a job without a relay, and the relay itself)."""

    def __init__(self, uri: str) -> None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        why = reachable(uri)
        if why:
            raise ConnectionError(why)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)

    def open_run(self, experiment: str, run_name: str, tags: dict[str, str], run_id: str | None,
                 keep_status: bool) -> tuple[str, str]:
        """(experiment id, run id): a new run, or ``run_id`` reopened (RUNNING unless ``keep_status``)."""
        from filelock import FileLock

        lock = FileLock(str(Path.cwd() / ".mlflow.lock")) if self.uri.startswith("sqlite:") else None
        if lock is not None:
            lock.acquire(timeout=120)  # parallel jobs: one creates the schema and the experiment
        try:
            exp = experiment_id(self.client, experiment, self.uri)
            if run_id is None:
                run_id = self.client.create_run(exp, run_name=run_name, tags=tags).info.run_id
            elif not keep_status:
                self.client.update_run(run_id, status="RUNNING")  # a resumed training job
        finally:
            if lock is not None:
                lock.release()
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


class RelayStore:
    """A :class:`Store` whose calls the relay at ``socket_path`` makes (errors: ServiceError)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = service.check_path(socket_path, WHAT)

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        return service.request(self.socket_path, {"op": op, **fields}, 1.0, REQUEST_TIMEOUT_S, WHAT)

    def open_run(self, experiment: str, run_name: str, tags: dict[str, str], run_id: str | None,
                 keep_status: bool) -> tuple[str, str]:
        answer = self._call("open_run", experiment=experiment, run_name=run_name, tags=tags, run_id=run_id,
                            keep_status=keep_status)
        return str(answer["experiment_id"]), str(answer["run_id"])

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[tuple[str, str]] = (),
                  tags: Sequence[tuple[str, str]] = ()) -> None:
        self._call("log_batch", run_id=run_id, metrics=list(metrics), params=list(params), tags=list(tags))

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None) -> None:
        self._call("log_artifact", run_id=run_id, path=str(Path(path).resolve()), artifact_path=artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._call("log_text", run_id=run_id, text=text, artifact_file=artifact_file)

    def set_terminated(self, run_id: str, status: str) -> None:
        self._call("set_terminated", run_id=run_id, status=status)


def relay_for(uri: str) -> RelayStore | None:
    """The relay named by ``$CAPRL_MLFLOW_RELAY`` if it answers and writes where this job would
    (the same URI from the same working directory); else None (and why, at debug level)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or path == service.OFF:
        return None
    try:
        relay = RelayStore(path)
        info = relay._call("info")
    except CaprlError as exc:
        log.info("MLflow relay not used (%s): this job talks to MLflow itself", exc)
        return None
    if info.get("uri") != uri or info.get("cwd") != os.getcwd():
        log.info("MLflow relay not used: it writes to %s from %s, this job to %s from %s", info.get("uri"),
                 info.get("cwd"), uri, os.getcwd())
        return None
    return relay


def open_store(uri: str) -> Store:
    """The relay if one serves this job's store, else MLflow's client in this process."""
    return relay_for(uri) or DirectStore(uri)


# -- the relay ---------------------------------------------------------------------------------
def _handler(uri: str) -> service.Handler:
    stores: list[DirectStore] = []  # made at the first call: a run that tracks nothing imports no MLflow

    def store() -> DirectStore:
        if not stores:
            stores.append(DirectStore(uri))
            log.info("MLflow relay: client on %s", uri)
        return stores[0]

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "info":
            return {"uri": uri, "cwd": os.getcwd()}
        if op == "open_run":
            exp, run_id = store().open_run(str(request["experiment"]), str(request["run_name"]),
                                           dict(request["tags"]), request.get("run_id"), bool(request["keep_status"]))
            return {"experiment_id": exp, "run_id": run_id}
        if op == "log_batch":
            store().log_batch(request["run_id"], [tuple(m) for m in request["metrics"]],  # type: ignore[misc]
                              [tuple(p) for p in request["params"]], [tuple(t) for t in request["tags"]])
        elif op == "log_artifact":
            store().log_artifact(request["run_id"], request["path"], request.get("artifact_path"))
        elif op == "log_text":
            store().log_text(request["run_id"], request["text"], request["artifact_file"])
        elif op == "set_terminated":
            store().set_terminated(request["run_id"], request["status"])
        else:
            raise ValueError(f"unknown MLflow relay request {op!r}")
        return {"ok": True}

    return handle


def start(socket_path: str, uri: str, parent_pid: int | None = None, log_path: str | Path | None = None,
          idle_timeout_s: float = IDLE_TIMEOUT_S) -> Any:
    """Launch the relay for ``uri`` from the current directory; return its process once it answers."""
    return service.start(SERVER_MODULE, socket_path, ["--uri", uri, "--idle-timeout", repr(float(idle_timeout_s))],
                         parent_pid, log_path, cwd=os.getcwd(), drop_env=[SOCKET_ENV], what=WHAT)


def start_shared(log_path: str | Path | None = None) -> str | None:
    """For the Snakefile's ``onstart``: a relay for this run's jobs, its socket in ``$CAPRL_MLFLOW_RELAY``
    (see :func:`socket_service.start_shared`); None (each job talks to MLflow) if it cannot start."""
    uri = tracking_uri()
    return service.start_shared(SOCKET_ENV, WHAT, lambda path: start(path, uri, log_path=log_path),
                                service.workflow_socket_path("mlflow"), SERVER_MODULE)


def stop_shared() -> None:
    """Stop the relay :func:`start_shared` started (if any); its calls so far are all made."""
    service.stop_shared(SOCKET_ENV)


def main(argv: Sequence[str] | None = None) -> None:
    parser = service.server_parser(SERVER_MODULE, __doc__)
    parser.add_argument("--uri", required=True, help="the MLflow tracking URI the jobs use")
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S, help="exit after this many idle seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s mlflow-relay %(levelname)s %(message)s")
    started = time.monotonic()
    try:
        service.serve(args.socket, _handler(args.uri), args.idle_timeout, args.parent_pid, WHAT)
    except CaprlError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None
    log.info("MLflow relay served for %.0f s", time.monotonic() - started)


if __name__ == "__main__":
    main()
