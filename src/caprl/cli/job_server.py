"""A pre-loaded process that forks the jobs of one local workflow run (the job server).

Every ``caprl <stage>`` job starts a Python interpreter and imports torch, numpy, h5py, MLflow,
torch's compiler front end (which ``torch.optim`` imports at the first step) and its stage's
modules before it does anything: ~5-8 s of CPU per job, for ~150 jobs in the demo, more than a
third of a small job's time. The job server imports all of that once; a job's ``caprl`` command
then sends its arguments, working directory, environment and standard streams (the file
descriptors themselves) over a Unix socket, and the server forks a child that runs the stage
exactly as the command would have (:func:`caprl.cli.main`), with the job's streams, directory,
environment, resource limits and umask (the command's side: :mod:`caprl.runtime.job_client`). The command waits for the child's exit status and exits with it; signals sent to
the command (Snakemake stopping a job, SIGTERM from a scheduler) are passed on to the child, and
a child whose command has gone is terminated. The server never runs torch code itself, so the
children start as fresh processes do (no thread pool, no CUDA context, unseeded RNGs that every
stage seeds from params.yaml), as PyTorch's own forked DataLoader workers do. One difference
remains: an environment variable that a preloaded library reads when it is imported (not when it
is used) has the value Snakemake started with; set such variables before ``snakemake``, or run
``CAPRL_JOB_SERVER=off snakemake ...`` (no server: every job by itself, as on a cluster).

The Snakefile's ``onstart`` starts it for local runs and exports ``$CAPRL_JOB_SERVER``; a
command that finds no server there (a cluster node, a stage run by hand) runs in its own process
as before. Protocol: the command sends one framed JSON request ``{"argv", "cwd", "env"}`` with
its fds 0, 1 and 2 attached (SCM_RIGHTS); the server answers ``{"pid": child}`` at once, then
``{"exit": code}`` (``code`` as a shell reports it: 128 + N for a child killed by signal N).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import logging
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caprl.runtime import socket_service as service, wire
from caprl.cli import STAGES, TOOLS
from caprl.cli import main as run_stage
from caprl.errors import CaprlError
from caprl.runtime.job_client import FORWARDED, LIMITS, SOCKET_ENV, pass_on

log = logging.getLogger(__name__)

SERVER_MODULE = "caprl.cli.job_server"
WHAT = "job server"
# What every job would import; a module that fails to import here is imported by its job as usual.
# MLflow imports its SQLite store (SQLAlchemy, alembic: ~1 s of CPU) only when a client first opens
# one, i.e. in every tracked job: preloaded too.
PRELOAD = ("numpy", "h5py", "torch", "torch._dynamo", "torch.optim", "mlflow.tracking", "mlflow.entities",
           "mlflow.store.tracking.sqlalchemy_store", "sqlalchemy.dialects.sqlite", "alembic.config",
           "pycocoevalcap.tokenizer.ptbtokenizer", "pycocoevalcap.bleu.bleu", "pycocoevalcap.meteor.meteor",
           "pycocoevalcap.rouge.rouge", "pycocoevalcap.cider.cider", "matplotlib.pyplot", "filelock", "yaml",
           "jsonschema", "tabulate")


# -- the server's side -------------------------------------------------------------------------
def preload() -> list[str]:
    """Import what the jobs import (and every pipeline stage's module); the names that failed."""
    failed = []
    for name in (*PRELOAD, *(module for stage, (module, _) in STAGES.items() if stage not in TOOLS)):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (its job will import it and report the error itself)
            log.info("not preloaded: %s (%s)", name, exc)
            failed.append(name)
    return failed


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request and the file descriptors that came with it (three for a job, none for a ping)."""
    conn.settimeout(service.REQUEST_READ_TIMEOUT_S)
    first, fds, _flags, _addr = socket.recv_fds(conn, wire.HEADER.size, 3)
    if not first:
        raise EOFError("connection closed before any request")
    request = wire.recv_rest(conn, first)
    if not isinstance(request, dict):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a request is a JSON object, not {type(request).__name__}")
    return request, list(fds)


def _child(request: dict[str, Any], fds: list[int], listener: socket.socket, conns: list[socket.socket]) -> None:
    """In the forked child: become the job (its streams, directory, environment, argv), run it, exit.

    Never returns: the interpreter's exit handlers run (h5py closes its files, as at a normal
    exit), then ``os._exit``, so nothing of the server's loop runs in the child.
    """
    code = 1
    try:
        for sig in (*FORWARDED, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        listener.close()
        for conn in conns:
            conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        take_process_state(request)
        os.environ.clear()
        os.environ.update({k: v for k, v in request["env"].items() if k != SOCKET_ENV})
        sys.argv = ["caprl", *request["argv"]]
        code = run_stage(list(request["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (reported on the job's own stderr, as the command would)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            gc.collect()
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def take_process_state(request: dict[str, Any]) -> None:
    """The command's resource limits and umask (:func:`caprl.runtime.job_client.process_state`), so
    that a job under ``ulimit -f`` or a strict umask behaves in the server as by itself. A limit the
    child may not take (above the server's hard limit) is said on the job's stderr."""
    if isinstance(request.get("umask"), int):
        os.umask(request["umask"])
    for name, (soft, hard) in (request.get("limits") or {}).items():
        if name not in LIMITS or not hasattr(resource, name):
            continue
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError) as exc:
            print(f"caprl: the job server could not give this job its command's {name} ({soft}, {hard}): {exc}; "
                  f"run it with {SOCKET_ENV}=off to have it", file=sys.stderr)


def _status_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(socket_path: str, parent_pid: int | None = None) -> None:
    """Preload, then fork a child per job request until ``parent_pid`` ends, SIGTERM/SIGINT or ``shutdown``.

    Unlike :func:`socket_service.serve` this loop keeps each job's connection until its child
    exits (to send the status), and terminates a child whose command has gone. The socket
    appears only once the preloading is done: commands that come earlier run by themselves.
    """
    path = service.check_path(socket_path, WHAT)
    started = time.monotonic()
    failed = preload()
    log.info("%s: preloaded in %.1f s%s", WHAT, time.monotonic() - started,
             f" (not: {', '.join(failed)})" if failed else "")

    def on_signal(signum: int, _frame: Any) -> None:
        raise service.Shutdown(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    jobs: dict[int, socket.socket | None] = {}  # child pid -> its command's connection (None: gone)
    listener: socket.socket | None = None
    inode, reason = -1, "?"
    try:
        listener, inode = service.bind(path, WHAT)
        service.write_pid_file(service.pid_file(path))
        log.info("%s %d listening at %s (parent %s)", WHAT, os.getpid(), path, parent_pid)
        while True:
            _reap(jobs)
            if parent_pid is not None and not service.alive(parent_pid):
                reason = f"parent {parent_pid} ended"
                break
            waiting = {conn: pid for pid, conn in jobs.items() if conn is not None}
            ready, _, _ = select.select([listener, *waiting], [], [], 0.2)
            for conn in ready:
                if conn is listener:
                    if _accept(listener, jobs):
                        raise service.Shutdown("shutdown request")
                else:  # a command's connection turns readable only when the command has gone
                    log.warning("%s: the command of job %d has gone; terminating the job", WHAT, waiting[conn])
                    pass_on(waiting[conn], signal.SIGTERM)
                    conn.close()
                    jobs[waiting[conn]] = None
    except service.Shutdown as exc:
        reason = str(exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in jobs:
            pass_on(child, signal.SIGTERM)
        if listener is not None:
            service.release(listener, path, inode)
        log.info("%s %d stopped: %s (%d running job(s) sent SIGTERM)", WHAT, os.getpid(), reason, len(jobs))


def _accept(listener: socket.socket, jobs: dict[int, socket.socket | None]) -> bool:
    """Take one connection: a ping, a shutdown (True) or a job (forked)."""
    conn, _ = listener.accept()
    try:
        request, fds = _receive(conn)
    except EOFError:  # a probe (socket_service.live_server_at)
        conn.close()
        return False
    except (OSError, ValueError) as exc:
        log.warning("%s: bad request dropped (%s)", WHAT, exc)
        conn.close()
        return False
    if request.get("ping") is True or request.get("shutdown") is True:
        with contextlib.suppress(OSError):
            wire.send(conn, {"ok": True, "pid": os.getpid()})
        conn.close()
        return request.get("shutdown") is True
    if len(fds) != 3 or not isinstance(request.get("argv"), list) or not isinstance(request.get("env"), dict):
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            wire.send(conn, {"error": "a job request is {argv, cwd, env} with fds 0, 1 and 2"})
        conn.close()
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, fds, listener, [*(c for c in jobs.values() if c is not None), conn])
    for fd in fds:
        os.close(fd)
    log.info("forked job %d: caprl %s (in %s)", pid, " ".join(map(str, request["argv"]))[:300], request.get("cwd"))
    jobs[pid] = conn
    conn.settimeout(5.0)
    with contextlib.suppress(OSError):
        wire.send(conn, {"pid": pid})
    return False


def _reap(jobs: dict[int, socket.socket | None]) -> None:
    """Send each exited child's status to its command and forget the child."""
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                wire.send(conn, {"exit": _status_code(status)})
            conn.close()


# -- starting and stopping ---------------------------------------------------------------------
def start(socket_path: str, parent_pid: int | None = None, log_path: str | Path | None = None) -> Any:
    """Launch the server without waiting for it (it preloads for ~10 s; commands that come before
    its socket exists run by themselves). Its process."""
    return service.start(SERVER_MODULE, socket_path, (), parent_pid, log_path, wait_s=None, drop_env=[SOCKET_ENV],
                         what=WHAT)


def start_shared(log_path: str | Path | None = None) -> str | None:
    """For the Snakefile's ``onstart``: a job server for this run's jobs, ``$CAPRL_JOB_SERVER`` set
    (``CAPRL_JOB_SERVER=off`` before ``snakemake``: none, every job runs by itself)."""
    return service.start_shared(SOCKET_ENV, WHAT, lambda path: start(path, log_path=log_path),
                                service.workflow_socket_path("jobs"), SERVER_MODULE)


def stop_shared() -> None:
    """Stop the job server :func:`start_shared` started (after the run: no job is left)."""
    service.stop_shared(SOCKET_ENV)


def main(argv: Sequence[str] | None = None) -> None:
    parser = service.server_parser(SERVER_MODULE, __doc__)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s job-server %(levelname)s %(message)s")
    try:
        serve(args.socket, args.parent_pid)
    except CaprlError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
