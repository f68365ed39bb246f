"""The two helpers a local run's jobs share, and ``caprl with-services <command>``.

* the job server (``$CAPRL_JOB_SERVER``, :mod:`caprl.cli.job_server`): torch, MLflow and every
  stage imported once; each ``caprl`` job is forked from it (~5-8 s of CPU saved per job);
* one METEOR JVM (``$CAPRL_METEOR_SOCKET``, :mod:`caprl.metrics.meteor_server`; ~6 s per
  evaluation).

Jobs find them through the environment and do the work themselves without them. The
Snakefile's ``onstart`` starts them for a local Snakemake run. ``dvc repro`` has no such
hook and runs its ~150 stages (the demo) one process each, so ``caprl with-services dvc
repro`` starts them, runs the command with their variables set, and stops them when it
ends (they also exit by themselves once this process is gone). The command's exit code is
``caprl with-services``'s; signals sent to it are passed on to the command.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

LOG_DIR = "logs/services"  # with-services' server logs (a Snakemake run's: .snakemake/log)


def _services() -> list[tuple[str, ModuleType]]:
    from caprl.cli import job_server
    from caprl.metrics import meteor_client

    return [("job server", job_server), ("METEOR server", meteor_client)]


def start_all(log_dir: str | Path) -> dict[str, str]:
    """Start the two services for the jobs this process spawns (their variables exported in
    ``os.environ``); ``{name: socket}`` of those that started (never raises)."""
    started = {}
    for name, service in _services():
        socket_path = service.start_shared(log_path=Path(log_dir) / f"{service.SERVER_MODULE}.log")
        if socket_path:
            started[name] = socket_path
    return started


def stop_all() -> None:
    """Stop what :func:`start_all` started (their variables unset)."""
    for _, service in _services():
        service.stop_shared()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command and its arguments, e.g. dvc repro (run in this directory)")


def main(args: argparse.Namespace) -> None:
    from caprl.errors import CaprlError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise CaprlError("with-services: no command given; e.g. `caprl with-services dvc repro`")
    for name, socket_path in start_all(LOG_DIR).items():
        log.info("%s for the jobs of `%s`: %s", name, " ".join(command), socket_path)
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        stop_all()
        raise CaprlError(f"with-services: cannot run {command[0]!r}: {exc}") from None
    passed = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    previous = {sig: signal.signal(sig, lambda sig, _frame: proc.send_signal(sig)) for sig in passed}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_all()
    sys.exit(code if code >= 0 else 128 - code)
