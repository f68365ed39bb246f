"""The client side of the shared METEOR server (:mod:`caprl.metrics.meteor_server`):
:class:`MeteorClient`, and starting / stopping a server (the Snakefile's hooks use
:func:`start_shared` and :func:`stop_shared`). The socket, its framing and the server's
lifetime are :mod:`caprl.runtime.socket_service`'s.

Requests: ``{"gts": {key: [str, ...]}, "res": {key: [str]}}`` (string keys, scored in the order
of ``gts``) answered with ``{"score": float, "scores": [float, ...]}``; ``ping`` and
``shutdown`` as every service.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from caprl.runtime import socket_service as service, wire
from caprl.runtime.socket_service import MAX_SOCKET_PATH, stop_process  # noqa: F401  (part of this module's API)

log = logging.getLogger(__name__)

SOCKET_ENV = "CAPRL_METEOR_SOCKET"
DEFAULT_IDLE_TIMEOUT_S = 1800.0
SERVER_MODULE = "caprl.metrics.meteor_server"
WHAT = "METEOR server"
MeteorServerError = wire.ServiceError  # the METEOR server failed to score a request
ServerUnavailable = wire.ServiceUnavailable  # no METEOR server answers at the socket


class MeteorClient:
    """Scores through a METEOR server: ``compute_score(gts, res)`` like pycocoevalcap's ``Meteor``.

    ``connect_timeout`` bounds the connection (a missing or dead socket fails at once);
    ``request_timeout`` bounds the wait for the answer, which includes the queue behind other
    clients and, for the first request, the JVM's start-up.
    """

    def __init__(self, socket_path: str | Path, connect_timeout: float = 3.0, request_timeout: float = 600.0) -> None:
        self.socket_path = service.check_path(socket_path, WHAT)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request, return the answer; MeteorServerError for an ``error`` answer."""
        return wire.request(self.socket_path, message, self.connect_timeout, self.request_timeout, WHAT)

    def ping(self) -> int:
        """The server's pid (ServerUnavailable if none answers)."""
        return int(self.request({"ping": True})["pid"])

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, list[float]]:
        """Corpus METEOR and per-item scores (in ``gts`` order) of already-tokenised strings.

        The keys are sent as their positions in ``gts`` ("0", "1", ...), so any hashable keys
        work and no two can collide as strings.
        """
        if set(gts) != set(res):
            raise ValueError("METEOR: references (gts) and results (res) cover different keys")
        keys = list(gts)
        bad = [k for k in keys if len(res[k]) != 1]
        if bad:
            raise ValueError(f"METEOR: every result needs exactly one caption; {len(bad)} do not (e.g. {bad[0]!r})")
        message = {
            "gts": {str(n): [str(s) for s in gts[k]] for n, k in enumerate(keys)},
            "res": {str(n): [str(res[k][0])] for n, k in enumerate(keys)},
        }
        answer = self.request(message)
        try:
            score, scores = float(answer["score"]), [float(s) for s in answer["scores"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise MeteorServerError(f"the METEOR server's answer is malformed: {exc!r}") from None
        if len(scores) != len(keys):
            raise MeteorServerError(f"the METEOR server returned {len(scores)} scores for {len(keys)} items")
        return score, scores


def start(
    socket_path: str | Path,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    parent_pid: int | None = None,
    log_path: str | Path | None = None,
    wait_s: float = 10.0,
) -> subprocess.Popen[bytes]:
    """Launch ``python -m caprl.metrics.meteor_server`` detached; return once it answers (it does
    not wait for the JVM, which starts at the first request). See :func:`socket_service.start`."""
    return service.start(SERVER_MODULE, socket_path, ["--idle-timeout", repr(float(idle_timeout_s))], parent_pid,
                         log_path, wait_s, drop_env=[SOCKET_ENV], what=WHAT)


def stop(socket_path: str | Path, timeout: float = 10.0) -> bool:
    """Stop the server at ``socket_path`` (see :func:`socket_service.stop`); whether one was found."""
    return service.stop(socket_path, SERVER_MODULE, timeout, WHAT)


def workflow_socket_path(pid: int | None = None) -> str:
    """``/tmp/caprl-meteor-<uid>-<pid>.sock``: short (Unix socket paths are limited) and per run."""
    return service.workflow_socket_path("meteor", pid)


# -- the workflow's shared server -----------------------------------------------------------------
def start_shared(idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, log_path: str | Path | None = None) -> str | None:
    """Start a server for the jobs this process will spawn and export ``$CAPRL_METEOR_SOCKET``.

    For Snakemake's ``onstart`` (:func:`socket_service.start_shared`): a live server already
    named by ``$CAPRL_METEOR_SOCKET`` is used as it is. Never raises: without java, or if the
    server cannot start, it logs why and returns None (every job then starts its own JVM).
    """
    import shutil

    if shutil.which("java") is None and not os.environ.get(SOCKET_ENV):
        log.info("METEOR server not started: java is not on PATH")
        return None
    return service.start_shared(SOCKET_ENV, WHAT, lambda path: start(path, idle_timeout_s, log_path=log_path),
                                workflow_socket_path(), SERVER_MODULE)


def stop_shared() -> None:
    """Stop the server :func:`start_shared` started (if any), reap it, unset ``$CAPRL_METEOR_SOCKET``."""
    service.stop_shared(SOCKET_ENV)
