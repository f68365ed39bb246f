"""One METEOR JVM shared by the jobs of a workflow run, behind a Unix domain socket.

pycocoevalcap's ``Meteor`` starts ``java -jar meteor-1.5.jar ... -stdio``, which spends about
6 s of CPU loading its 61 MB paraphrase table before it scores anything; scoring 200 captions
then takes 0.2 s. Every ``caprl evaluate`` job (one per trained run) paid that start-up. This
module keeps ONE such JVM in a small server process that the jobs of one Snakemake run on one
machine share (the Snakefile's ``onstart`` starts it and exports ``$CAPRL_METEOR_SOCKET``;
:meth:`caprl.metrics.official.OfficialScorer.meteor` uses it when it answers and falls back to
its own JVM otherwise). The server runs the same ``Meteor`` class on the same strings, so the
scores are identical to the in-process ones.

Lifetime: the JVM starts at the first scoring request (a run that needs no METEOR, e.g. one
that only rebuilds tables, pays nothing). The server exits, closing the JVM and removing its
socket, when it has been idle for ``idle_timeout_s``, when ``parent_pid`` (the Snakemake
process) is gone, on SIGTERM/SIGINT or on a ``shutdown`` request (:func:`stop`).

The client side (``MeteorClient``, ``start``, ``stop``, the Snakefile's ``start_shared`` /
``stop_shared``) is :mod:`caprl.metrics.meteor_client`; the socket, the serving loop and the
lifetime are :mod:`caprl.runtime.socket_service`'s, which serves one request at a time (pycocoevalcap's
``Meteor`` drives one stdin/stdout pipe and is not re-entrant).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caprl.runtime import socket_service as service
from caprl.errors import CaprlError
from caprl.metrics import meteor_pipe
from caprl.metrics.meteor_client import (  # noqa: F401  (the client side, re-exported)
    DEFAULT_IDLE_TIMEOUT_S, MAX_SOCKET_PATH, SOCKET_ENV, WHAT, MeteorClient, MeteorServerError, ServerUnavailable,
    start, start_shared, stop, stop_process, stop_shared, workflow_socket_path)

log = logging.getLogger(__name__)


def _close_meteor(meteor: Any) -> None:
    """Kill a pycocoevalcap Meteor's JVM and close its pipes (its own ``__del__`` may block on its lock)."""
    proc = meteor.meteor_p
    with contextlib.suppress(OSError):
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe:
            with contextlib.suppress(OSError):
                pipe.close()


class _Scorer:
    """The server's one Meteor, started at the first request and restarted after a failure."""

    def __init__(self) -> None:
        self._meteor: Any = None

    def score(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[float, list[float]]:
        if self._meteor is None:
            from pycocoevalcap.meteor.meteor import Meteor

            self._meteor = Meteor()  # the JVM loads its tables during the first compute_score
            log.info("METEOR JVM started (pid %d)", self._meteor.meteor_p.pid)
        try:
            score, scores = meteor_pipe.compute_score(self._meteor, gts, res)
        except (OSError, ValueError) as exc:  # the JVM died: broken pipe or an empty answer
            self.close()
            message = f"METEOR's Java process failed ({exc}); it is restarted at the next request"
            raise MeteorServerError(message) from exc
        return float(score), [float(s) for s in scores]

    def close(self) -> None:
        meteor, self._meteor = self._meteor, None
        if meteor is not None:
            _close_meteor(meteor)


def _validate(request: Any) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    if not (isinstance(request, dict) and all(isinstance(request.get(k), dict) for k in ("gts", "res"))):
        raise ValueError('a scoring request is {"gts": {key: [str, ...]}, "res": {key: [str]}}')
    gts, res = request["gts"], request["res"]
    if set(gts) != set(res):
        raise ValueError("gts and res cover different keys")
    for key in gts:
        if not isinstance(gts[key], list) or not all(isinstance(s, str) for s in gts[key]):
            raise ValueError(f"gts[{key!r}] is not a list of strings")
        if not isinstance(res[key], list) or len(res[key]) != 1 or not isinstance(res[key][0], str):
            raise ValueError(f"res[{key!r}] is not a list of exactly one string")
    return gts, res


def serve(
    socket_path: str | Path, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, parent_pid: int | None = None
) -> None:
    """Run the server until idle for ``idle_timeout_s``, ``parent_pid`` ends, SIGTERM or ``shutdown``.

    Owns one pycocoevalcap Meteor (started at the first scoring request); always closes it.
    """
    scorer = _Scorer()

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        score, scores = scorer.score(*_validate(request))
        return {"score": score, "scores": scores}

    service.serve(socket_path, handle, idle_timeout_s, parent_pid, WHAT, close=scorer.close)


# -- starting and stopping ---------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m caprl.metrics.meteor_server", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="Unix socket path (at most 107 bytes)")
    parser.add_argument(
        "--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, help="exit after this many idle seconds"
    )
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--verbose", action="store_true", help="log start, stop and JVM start-up to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s meteor-server %(levelname)s %(message)s",
    )
    try:
        serve(args.socket, args.idle_timeout, args.parent_pid)
    except CaprlError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
