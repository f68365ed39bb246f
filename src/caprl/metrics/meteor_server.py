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

The protocol and the client side (``MeteorClient``, ``start``, ``stop``, the Snakefile's
``start_shared``/``stop_shared``) are in :mod:`caprl.metrics.meteor_client`; requests are served
one at a time (pycocoevalcap's ``Meteor`` drives one stdin/stdout pipe and is not re-entrant);
waiting clients queue in the socket's backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caprl.errors import CaprlError

log = logging.getLogger(__name__)
from caprl.metrics.meteor_client import (  # noqa: F401  (the client side, re-exported)
    DEFAULT_IDLE_TIMEOUT_S, MAX_SOCKET_PATH, SOCKET_ENV, MeteorClient, MeteorServerError, ServerUnavailable,
    _alive, _check_path, _live_server_at, _pid_file, _recv, _send, _Shutdown, start, start_shared, stop,
    stop_process, stop_shared, workflow_socket_path, _is_meteor_server, _POLL_S, _REQUEST_READ_TIMEOUT_S)

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
    if meteor.lock.locked():  # pycocoevalcap does not release its lock when the JVM fails
        meteor.lock.release()


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
            score, scores = self._meteor.compute_score(gts, res)
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


def _bind(path: str) -> tuple[socket.socket, int]:
    """Listen at ``path``: bound under a temporary name, then renamed over any stale file.

    Clients never see a half-initialised socket, and a socket file left by a killed server
    (or any other file there) is replaced. A LIVE server at the path is not: CaprlError.
    """
    if os.path.lexists(path) and _live_server_at(path):
        raise CaprlError(f"a METEOR server already answers at {path}")
    temp = os.path.join(os.path.dirname(path) or ".", f".caprl-meteor-{os.getpid()}.tmp")
    _check_path(temp)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(temp)
        os.chmod(temp, 0o600)  # the socket runs a JVM on request: this user only
        sock.listen(128)
        os.rename(temp, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return sock, os.stat(path).st_ino


def serve(
    socket_path: str | Path, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, parent_pid: int | None = None
) -> None:
    """Run the server until idle for ``idle_timeout_s``, ``parent_pid`` ends, SIGTERM or ``shutdown``.

    Owns one pycocoevalcap Meteor (started at the first scoring request); always closes it
    and removes its socket (and pid file) on the way out, if they are still its own.
    """
    path = _check_path(socket_path)
    pid_path = _pid_file(path)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Shutdown(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    scorer = _Scorer()
    listener: socket.socket | None = None
    inode = -1
    reason = "?"
    try:
        listener, inode = _bind(path)
        _write_pid_file(pid_path)
        log.info(
            "METEOR server %d listening at %s (parent %s, idle timeout %g s)",
            os.getpid(), path, parent_pid, idle_timeout_s,
        )  # fmt: skip
        last_active = time.monotonic()
        while True:
            if parent_pid is not None and not _alive(parent_pid):
                reason = f"parent {parent_pid} ended"
                break
            if time.monotonic() - last_active > idle_timeout_s:
                reason = f"idle for {idle_timeout_s:g} s"
                break
            ready, _, _ = select.select([listener], [], [], min(_POLL_S, max(idle_timeout_s, 0.05)))
            if not ready:
                continue
            conn, _ = listener.accept()
            with conn:
                if _handle(conn, scorer):
                    reason = "shutdown request"
                    break
            last_active = time.monotonic()
    except _Shutdown as exc:
        reason = str(exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        scorer.close()
        if listener is not None:
            listener.close()
            _remove_if_own(path, inode)
            with contextlib.suppress(OSError):
                if Path(pid_path).read_text().strip() == str(os.getpid()):
                    os.unlink(pid_path)
        log.info("METEOR server %d stopped: %s", os.getpid(), reason)


def _write_pid_file(pid_path: str) -> None:
    """This process's pid beside the socket (for :func:`stop`); never through a planted symlink."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pid_path)
    fd = os.open(pid_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def _remove_if_own(path: str, inode: int) -> None:
    """Remove the socket file unless a newer server has replaced it since."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)


def _handle(conn: socket.socket, scorer: _Scorer) -> bool:
    """Answer one connection; True when it asked the server to shut down."""
    conn.settimeout(_REQUEST_READ_TIMEOUT_S)
    try:
        request = _recv(conn)
    except EOFError:  # a probe (see _live_server_at): nothing to answer
        return False
    except (OSError, ValueError) as exc:  # a client that vanished or sent garbage: drop it
        log.warning("METEOR server: bad or incomplete request dropped (%s)", exc)
        return False
    shutdown = isinstance(request, dict) and request.get("shutdown") is True
    try:
        if shutdown or (isinstance(request, dict) and request.get("ping") is True):
            answer: dict[str, Any] = {"ok": True, "pid": os.getpid()}
        else:
            gts, res = _validate(request)
            score, scores = scorer.score(gts, res)
            answer = {"score": score, "scores": scores}
    except (ValueError, MeteorServerError) as exc:
        answer = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 (anything else: report it to the client, keep serving)
        log.exception("METEOR server: request failed")
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        conn.settimeout(_REQUEST_READ_TIMEOUT_S)
        _send(conn, answer)
    except OSError as exc:  # the client gave up waiting
        log.warning("METEOR server: could not answer (%s)", exc)
    return shutdown


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
