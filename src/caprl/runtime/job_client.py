"""The command's side of the job server (:mod:`caprl.cli.job_server`): run a ``caprl`` stage there.

Light on purpose (no torch, no caprl stage imported): it is what every job's ``caprl`` command
does first under a local Snakemake run.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
from collections.abc import Sequence

from caprl.runtime import socket_service as service, wire

SOCKET_ENV = "CAPRL_JOB_SERVER"
OFF = service.OFF  # `CAPRL_JOB_SERVER=off snakemake ...`: no job server, every job runs by itself
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)  # the command passes these on
#: resource limits the job takes from its command (``ulimit -f`` before a job holds in the job server too)
LIMITS = ("RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
          "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_NPROC")


def process_state() -> dict[str, object]:
    """What a job inherits from its process besides argv, cwd, environment and streams: its
    resource limits and umask, for the server's child to take on."""
    mask = os.umask(0)
    os.umask(mask)
    limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS if hasattr(resource, name)}
    return {"limits": limits, "umask": mask}


def run_in_server(argv: Sequence[str]) -> int | None:
    """Run ``caprl *argv`` in the job server named by ``$CAPRL_JOB_SERVER``; its exit code, or None
    when no server answers there (the caller then runs the stage itself)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or path == OFF:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(path)
        data = wire.frame({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ), **process_state()})
        socket.send_fds(sock, [data], [0, 1, 2])
        answer = wire.recv(sock)
        child = int(answer["pid"])
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        sock.close()
        return None  # no server, a stale socket or a refusal: the stage runs in this process
    previous = {sig: signal.signal(sig, lambda signum, _frame: pass_on(child, signum)) for sig in FORWARDED}
    try:
        sock.settimeout(None)
        return int(wire.recv(sock)["exit"])  # a forwarded signal's handler returns: the read goes on
    except (OSError, ValueError, EOFError, KeyError, TypeError) as exc:
        print(f"caprl: the job server lost job {child} ({exc!r}); see its log in .snakemake/log/", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def pass_on(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signum)

