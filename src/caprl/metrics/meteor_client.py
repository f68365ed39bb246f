"""The client side of the shared METEOR server (:mod:`caprl.metrics.meteor_server`): its protocol,
:class:`MeteorClient`, and starting / stopping a server (the Snakefile's hooks use
:func:`start_shared` and :func:`stop_shared`).

Protocol: one request per connection. Each message, both ways, is an 8-byte big-endian length
followed by that many bytes of UTF-8 JSON. Requests: ``{"gts": {key: [str, ...]}, "res": {key:
[str]}}`` (string keys, scored in the order of ``gts``) answered with ``{"score": float,
"scores": [float, ...]}``; ``{"ping": true}`` answered with ``{"ok": true, "pid": int}``;
``{"shutdown": true}`` answered with ``{"ok": true}`` before the server exits. Failures are
answered with ``{"error": message}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SOCKET_ENV = "CAPRL_METEOR_SOCKET"
DEFAULT_IDLE_TIMEOUT_S = 1800.0
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path is 108 bytes on Linux, NUL included
_HEADER = struct.Struct(">Q")
_MAX_MESSAGE = 256 * 1024 * 1024  # a sanity bound on a request's size, not a real limit
_REQUEST_READ_TIMEOUT_S = 30.0  # the server never waits longer for a client to send its request
_POLL_S = 1.0  # how often the server checks its parent, its idle time and signals


class MeteorServerError(CaprlError):
    """The METEOR server failed to score a request (the message says how)."""


class ServerUnavailable(MeteorServerError):
    """No METEOR server answers at the socket (missing, stale, refused or timed out)."""


class _Shutdown(BaseException):
    """Raised by the signal handlers to leave the serving loop (cleanup runs in ``finally``).

    A BaseException, so the per-request ``except Exception`` does not swallow it.
    """


# -- framing ---------------------------------------------------------------------------------
def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    data = json.dumps(message).encode("utf-8")
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    """One message; EOFError if the peer closed without sending anything (a liveness probe)."""
    first = sock.recv(_HEADER.size)
    if not first:
        raise EOFError("connection closed before any request")
    (size,) = _HEADER.unpack(first + _recv_exact(sock, _HEADER.size - len(first)))
    if size > _MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is larger than the {_MAX_MESSAGE}-byte limit")
    return json.loads(_recv_exact(sock, size).decode("utf-8"))


def _check_path(socket_path: str | Path) -> str:
    path = os.fspath(socket_path)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise CaprlError(
            f"METEOR server socket path is {len(os.fsencode(path))} bytes, longer than the "
            f"{MAX_SOCKET_PATH} a Unix socket allows: {path} (use a short path under /tmp)"
        )
    return path


def _pid_file(socket_path: str) -> str:
    return socket_path + ".pid"


# -- client ----------------------------------------------------------------------------------
class MeteorClient:
    """Scores through a METEOR server: ``compute_score(gts, res)`` like pycocoevalcap's ``Meteor``.

    ``connect_timeout`` bounds the connection (a missing or dead socket fails at once);
    ``request_timeout`` bounds the wait for the answer, which includes the queue behind other
    clients and, for the first request, the JVM's start-up.
    """

    def __init__(self, socket_path: str | Path, connect_timeout: float = 3.0, request_timeout: float = 600.0) -> None:
        self.socket_path = _check_path(socket_path)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request, return the answer; MeteorServerError for an ``error`` answer."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(self.socket_path)
            except OSError as exc:  # FileNotFoundError, ConnectionRefusedError (stale), timeout
                raise ServerUnavailable(f"no METEOR server at {self.socket_path}: {exc}") from None
            sock.settimeout(self.request_timeout)
            try:
                _send(sock, message)
                answer = _recv(sock)
            except (OSError, ValueError, EOFError) as exc:
                raise MeteorServerError(f"the METEOR server at {self.socket_path} failed: {exc!r}") from None
        finally:
            sock.close()
        if not isinstance(answer, dict):
            raise MeteorServerError(f"the METEOR server answered {type(answer).__name__}, not an object")
        if "error" in answer:
            raise MeteorServerError(f"the METEOR server could not score: {answer['error']}")
        return answer

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


# -- server ----------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a dead child not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _live_server_at(path: str) -> bool:
    """Whether something accepts connections at ``path`` (a stale file or socket does not)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def start(
    socket_path: str | Path,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    parent_pid: int | None = None,
    log_path: str | Path | None = None,
    wait_s: float = 10.0,
) -> subprocess.Popen[bytes]:
    """Launch ``python -m caprl.metrics.meteor_server`` detached; return once it answers.

    The server gets its own session and none of the caller's file descriptors (stdin from
    /dev/null, stdout/stderr to ``log_path`` or /dev/null), so a Snakemake job or Snakemake
    itself never waits on its output. ``parent_pid`` defaults to the caller. Waits up to
    ``wait_s`` seconds for the socket to answer (it does not wait for the JVM, which starts
    at the first request); raises CaprlError if the server exited or did not answer in time.
    """
    path = _check_path(socket_path)
    parent = os.getpid() if parent_pid is None else int(parent_pid)
    command = [
        sys.executable, "-m", "caprl.metrics.meteor_server",
        "--socket", path, "--idle-timeout", repr(float(idle_timeout_s)), "--parent-pid", str(parent),
    ]  # fmt: skip
    if log_path is not None:
        command += ["--verbose"]
    env = os.environ.copy()
    src = str(Path(__file__).resolve().parents[2])  # where `caprl` is imported from here
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env.pop(SOCKET_ENV, None)
    out: IO[bytes] | int = subprocess.DEVNULL
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")  # noqa: SIM115 (handed to the child, closed below)
    try:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env, cwd="/",
        )  # fmt: skip
    finally:
        if not isinstance(out, int):
            out.close()
    client = MeteorClient(path, connect_timeout=1.0, request_timeout=5.0)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if client.ping() == proc.pid:
                return proc
        except MeteorServerError:
            pass
        if proc.poll() is not None:
            raise CaprlError(f"the METEOR server exited at start-up with status {proc.returncode}"
                             + (f" (see {log_path})" if log_path else ""))  # fmt: skip
        if time.monotonic() > deadline:
            stop_process(proc)
            raise CaprlError(f"the METEOR server did not answer at {path} within {wait_s:g} s")
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a server started by :func:`start` and reap it (SIGKILL if it does not exit)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop(socket_path: str | Path, timeout: float = 10.0) -> bool:
    """Stop the server at ``socket_path``: a ``shutdown`` request, else SIGTERM to its pid file's pid.

    Returns whether a server was found. Removes the socket and pid files if they were left.
    """
    path = _check_path(socket_path)
    pid_path = _pid_file(path)
    pid: int | None = None
    with contextlib.suppress(OSError, ValueError):
        pid = int(Path(pid_path).read_text().strip())
    found = False
    try:
        found = bool(MeteorClient(path, connect_timeout=2.0, request_timeout=timeout).request({"shutdown": True}))
    except MeteorServerError:
        if pid is not None and _alive(pid) and _is_meteor_server(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                found = True
    if pid is not None:  # the shutdown answer comes just before the process exits: wait for it
        deadline = time.monotonic() + timeout
        while _alive(pid) and _is_meteor_server(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if not (os.path.lexists(path) and _live_server_at(path)):
        for leftover in (path, pid_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    return found


def _is_meteor_server(pid: int) -> bool:
    """Whether ``pid`` runs this module (so a pid file never makes us signal a recycled pid)."""
    try:
        return b"caprl.metrics.meteor_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# -- the workflow's shared server -----------------------------------------------------------------
_shared: tuple[str, subprocess.Popen[bytes]] | None = None  # (socket, process) started by start_shared


def workflow_socket_path(pid: int | None = None) -> str:
    """``/tmp/caprl-meteor-<uid>-<pid>.sock``: short (Unix socket paths are limited) and per run."""
    return f"/tmp/caprl-meteor-{os.getuid()}-{os.getpid() if pid is None else pid}.sock"


def start_shared(idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, log_path: str | Path | None = None) -> str | None:
    """Start a server for the jobs this process will spawn and export ``$CAPRL_METEOR_SOCKET``.

    For Snakemake's ``onstart``: the server is tied to this process (it exits when this
    process does, at the latest). If ``$CAPRL_METEOR_SOCKET`` already names a live server
    (e.g. one the user started for several runs), that one is used and nothing is started.
    Never raises: without java, or if the server cannot start, it logs why and returns None
    (the jobs then start their own JVMs, as without a server).
    """
    global _shared
    import shutil

    existing = os.environ.get(SOCKET_ENV)
    if existing:
        with contextlib.suppress(CaprlError, OSError):
            MeteorClient(existing, connect_timeout=1.0, request_timeout=5.0).ping()
            log.info("METEOR server: using the one at $%s=%s", SOCKET_ENV, existing)
            return existing
    if shutil.which("java") is None:
        log.info("METEOR server not started: java is not on PATH")
        return None
    path = workflow_socket_path()
    try:
        proc = start(path, idle_timeout_s=idle_timeout_s, parent_pid=os.getpid(), log_path=log_path)
    except (CaprlError, OSError) as exc:
        log.warning("METEOR server not started (%s); every job starts its own METEOR JVM", exc)
        return None
    _shared = (path, proc)
    os.environ[SOCKET_ENV] = path
    return path


def stop_shared() -> None:
    """Stop the server :func:`start_shared` started (if any), reap it, unset ``$CAPRL_METEOR_SOCKET``."""
    global _shared
    if _shared is None:
        return
    (path, proc), _shared = _shared, None
    if os.environ.get(SOCKET_ENV) == path:
        del os.environ[SOCKET_ENV]
    try:
        stop(path)
    except (CaprlError, OSError) as exc:
        log.warning("stopping the METEOR server at %s failed: %s; sending SIGTERM", path, exc)
    stop_process(proc)
