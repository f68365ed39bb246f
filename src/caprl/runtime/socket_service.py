"""A small server behind a Unix domain socket, shared by the jobs of one local workflow run.

Two services use it: the METEOR JVM (:mod:`caprl.metrics.meteor_server`) and the job server
(:mod:`caprl.cli.job_server`). Each saves every job a start-up cost it would otherwise pay
alone (a JVM; importing torch, MLflow and the stage). A service module supplies a
handler (one request dict -> one answer dict); this module supplies the rest: binding over
stale files, the serving loop, its lifetime (idle timeout, the parent process's
end, SIGTERM/SIGINT, a ``shutdown`` request), a pid file, and starting and stopping the
server process.

The messages and the client's side: :mod:`caprl.runtime.wire`. Requests are served one at a
time; waiting clients queue in the socket's backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from caprl.errors import CaprlError
from caprl.runtime.wire import ServiceError, ping, recv, request, send

log = logging.getLogger(__name__)
OFF = "off"  # a server variable set to this: no shared server, each job works alone

MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path is 108 bytes on Linux, NUL included
REQUEST_READ_TIMEOUT_S = 30.0  # the server never waits longer for a client to send its request
POLL_S = 1.0  # how often the server checks its parent, its idle time and signals

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class Shutdown(BaseException):
    """Raised by the signal handlers to leave the serving loop (cleanup runs in ``finally``).

    A BaseException, so the per-request ``except Exception`` does not swallow it.
    """


def check_path(socket_path: str | Path, what: str = "server") -> str:
    path = os.fspath(socket_path)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise CaprlError(f"{what} socket path is {len(os.fsencode(path))} bytes, longer than the "
                         f"{MAX_SOCKET_PATH} a Unix socket allows: {path} (use a short path under /tmp)")
    return path


def pid_file(socket_path: str) -> str:
    return socket_path + ".pid"


# -- processes -------------------------------------------------------------------------------
def alive(pid: int) -> bool:
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


def live_server_at(path: str) -> bool:
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


def runs_module(pid: int, module: str) -> bool:
    """Whether ``pid`` runs ``python -m module`` (so a pid file never makes us signal a recycled pid)."""
    try:
        return module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# -- serving ---------------------------------------------------------------------------------
def bind(path: str, what: str = "server") -> tuple[socket.socket, int]:
    """Listen at ``path``: bound under a temporary name, then renamed over any stale file.

    Clients never see a half-initialised socket, and a socket file left by a killed server
    (or any other file there) is replaced. A LIVE server at the path is not: CaprlError.
    """
    if os.path.lexists(path) and live_server_at(path):
        raise CaprlError(f"a {what} already answers at {path}")
    temp = os.path.join(os.path.dirname(path) or ".", f".caprl-service-{os.getpid()}.tmp")
    check_path(temp, what)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(temp)
        os.chmod(temp, 0o600)  # the services run programs and write files on request: this user only
        sock.listen(128)
        os.rename(temp, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return sock, os.stat(path).st_ino


def write_pid_file(pid_path: str) -> None:
    """This process's pid beside the socket (for :func:`stop`); never through a planted symlink."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pid_path)
    fd = os.open(pid_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def release(listener: socket.socket, path: str, inode: int) -> None:
    """Close the listening socket; remove its file unless a newer server has replaced it since, and
    the pid file if it is still this process's."""
    listener.close()
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    with contextlib.suppress(OSError):
        if Path(pid_file(path)).read_text().strip() == str(os.getpid()):
            os.unlink(pid_file(path))


def _handle(conn: socket.socket, handler: Handler, what: str) -> bool:
    """Answer one connection; True when it asked the server to shut down."""
    conn.settimeout(REQUEST_READ_TIMEOUT_S)
    try:
        message = recv(conn)
    except EOFError:  # a probe (see live_server_at): nothing to answer
        return False
    except (OSError, ValueError) as exc:  # a client that vanished or sent garbage: drop it
        log.warning("%s: bad or incomplete request dropped (%s)", what, exc)
        return False
    shutdown = isinstance(message, dict) and message.get("shutdown") is True
    try:
        if shutdown or (isinstance(message, dict) and message.get("ping") is True):
            answer: dict[str, Any] = {"ok": True, "pid": os.getpid()}
        elif not isinstance(message, dict):
            raise ValueError(f"a request is a JSON object, not {type(message).__name__}")
        else:
            answer = handler(message)
    except (ValueError, ServiceError) as exc:
        answer = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 (anything else: report it to the client, keep serving)
        log.exception("%s: request failed", what)
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        conn.settimeout(REQUEST_READ_TIMEOUT_S)
        send(conn, answer)
    except OSError as exc:  # the client gave up waiting
        log.warning("%s: could not answer (%s)", what, exc)
    return shutdown


def serve(socket_path: str | Path, handler: Handler, idle_timeout_s: float, parent_pid: int | None = None,
          what: str = "server", close: Callable[[], None] | None = None) -> None:
    """Serve until idle for ``idle_timeout_s``, ``parent_pid`` ends, SIGTERM/SIGINT or ``shutdown``.

    ``close`` (the service's own resources) always runs on the way out, and the socket and pid
    file are removed if they are still this server's own.
    """
    path = check_path(socket_path, what)
    pid_path = pid_file(path)

    def on_signal(signum: int, _frame: Any) -> None:
        raise Shutdown(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    listener: socket.socket | None = None
    inode = -1
    reason = "?"
    try:
        listener, inode = bind(path, what)
        write_pid_file(pid_path)
        log.info("%s %d listening at %s (parent %s, idle timeout %g s)", what, os.getpid(), path, parent_pid,
                 idle_timeout_s)
        last_active = time.monotonic()
        while True:
            if parent_pid is not None and not alive(parent_pid):
                reason = f"parent {parent_pid} ended"
                break
            if time.monotonic() - last_active > idle_timeout_s:
                reason = f"idle for {idle_timeout_s:g} s"
                break
            ready, _, _ = select.select([listener], [], [], min(POLL_S, max(idle_timeout_s, 0.05)))
            if not ready:
                continue
            conn, _ = listener.accept()
            with conn:
                if _handle(conn, handler, what):
                    reason = "shutdown request"
                    break
            last_active = time.monotonic()
    except Shutdown as exc:
        reason = str(exc)
    finally:
        for sig, previous_handler in previous.items():
            signal.signal(sig, previous_handler)
        if close is not None:
            close()
        if listener is not None:
            release(listener, path, inode)
        log.info("%s %d stopped: %s", what, os.getpid(), reason)


# -- starting and stopping -------------------------------------------------------------------
def start(module: str, socket_path: str | Path, args: Sequence[str] = (), parent_pid: int | None = None,
          log_path: str | Path | None = None, wait_s: float | None = 10.0,
          drop_env: Sequence[str] = (), what: str = "server") -> subprocess.Popen[bytes]:
    """Launch ``python -m module --socket P --parent-pid N [--verbose] *args`` detached; return once
    it answers a ping.

    The server gets its own session and none of the caller's file descriptors (stdin from
    /dev/null, stdout/stderr to ``log_path`` or /dev/null), so a Snakemake job or Snakemake
    itself never waits on its output. ``parent_pid`` defaults to the caller; ``drop_env`` names
    environment variables the server must not inherit. CaprlError if the server exited or did
    not answer within ``wait_s`` seconds; ``wait_s`` None: return at once (a server that prepares
    itself before its socket appears).
    """
    path = check_path(socket_path, what)
    parent = os.getpid() if parent_pid is None else int(parent_pid)
    command = [sys.executable, "-m", module, "--socket", path, "--parent-pid", str(parent), *args]
    if log_path is not None:
        command += ["--verbose"]
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    src = str(Path(__file__).resolve().parents[2])  # where `caprl` is imported from here
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    out: IO[bytes] | int = subprocess.DEVNULL
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")  # noqa: SIM115 (handed to the child, closed below)
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env, cwd="/")
    finally:
        if not isinstance(out, int):
            out.close()
    if wait_s is None:
        return proc
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(ServiceError):
            if ping(path, what) == proc.pid:
                return proc
        if proc.poll() is not None:
            raise CaprlError(f"the {what} exited at start-up with status {proc.returncode}"
                             + (f" (see {log_path})" if log_path else ""))
        if time.monotonic() > deadline:
            stop_process(proc)
            raise CaprlError(f"the {what} did not answer at {path} within {wait_s:g} s")
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


def stop(socket_path: str | Path, module: str, timeout: float = 10.0, what: str = "server") -> bool:
    """Stop the server at ``socket_path``: a ``shutdown`` request, else SIGTERM to its pid file's pid
    (if that process runs ``module``). Returns whether a server was found; removes the socket and
    pid files if they were left."""
    path = check_path(socket_path, what)
    pid_path = pid_file(path)
    pid: int | None = None
    with contextlib.suppress(OSError, ValueError):
        pid = int(Path(pid_path).read_text().strip())
    found = False
    try:
        found = bool(request(path, {"shutdown": True}, 2.0, timeout, what))
    except ServiceError:
        if pid is not None and alive(pid) and runs_module(pid, module):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                found = True
    if pid is not None:  # the shutdown answer comes just before the process exits: wait for it
        deadline = time.monotonic() + timeout
        while alive(pid) and runs_module(pid, module) and time.monotonic() < deadline:
            time.sleep(0.05)
    if not (os.path.lexists(path) and live_server_at(path)):
        for leftover in (path, pid_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    return found


def workflow_socket_path(service: str, pid: int | None = None) -> str:
    """``/tmp/caprl-<service>-<uid>-<pid>.sock``: short (Unix socket paths are limited) and per run."""
    return f"/tmp/caprl-{service}-{os.getuid()}-{os.getpid() if pid is None else pid}.sock"


def server_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line every service's ``python -m module`` takes (plus its own options)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n")[0])
    parser.add_argument("--socket", required=True, help="Unix socket path (at most 107 bytes)")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--verbose", action="store_true", help="log start, stop and failures to stderr")
    return parser


_shared: dict[str, SharedServer] = {}  # env var -> the server start_shared started for this process's jobs


def start_shared(env_var: str, what: str, launch: Callable[[str], subprocess.Popen[bytes]], socket_path: str,
                 module: str) -> str | None:
    """:meth:`SharedServer.start` of a new server, kept for :func:`stop_shared` (the Snakefile's hooks)."""
    _shared[env_var] = SharedServer(env_var, what, launch, socket_path, module)
    return _shared[env_var].start()


def stop_shared(env_var: str) -> None:
    """Stop the server :func:`start_shared` started for ``env_var`` (if any)."""
    server = _shared.pop(env_var, None)
    if server is not None:
        server.stop()


class SharedServer:
    """One server for every job the calling process (Snakemake) spawns; its socket exported in
    ``$env_var``, so that the jobs find it. For the Snakefile's ``onstart`` / ``onsuccess`` /
    ``onerror``: :meth:`start` never raises (the jobs then do the work themselves, as without a
    server), and the server exits with the calling process at the latest.
    """

    def __init__(self, env_var: str, what: str, launch: Callable[[str], subprocess.Popen[bytes]],
                 socket_path: str, module: str) -> None:
        self.env_var, self.what, self.launch, self.socket_path, self.module = env_var, what, launch, socket_path, module
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str | None:
        """The socket; an already exported live server is used as it is (one the user started);
        ``$env_var=off`` (e.g. ``CAPRL_METEOR_SOCKET=off snakemake ...``): none, every job does its
        work itself (how docs/pipeline.md measures what each server saves)."""
        existing = os.environ.get(self.env_var)
        if existing == OFF:
            log.info("%s not started: $%s=%s", self.what, self.env_var, OFF)
            return None
        if existing:
            with contextlib.suppress(CaprlError, OSError):
                ping(existing, self.what)
                log.info("%s: using the one at $%s=%s", self.what, self.env_var, existing)
                return existing
        try:
            self.proc = self.launch(self.socket_path)
        except (CaprlError, OSError) as exc:
            log.warning("%s not started (%s); every job does its work itself", self.what, exc)
            return None
        os.environ[self.env_var] = self.socket_path
        return self.socket_path

    def stop(self) -> None:
        """Stop the server :meth:`start` started (if any), reap it and unset the variable."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if os.environ.get(self.env_var) == self.socket_path:
            del os.environ[self.env_var]
        try:
            stop(self.socket_path, self.module, what=self.what)
        except (CaprlError, OSError) as exc:
            log.warning("stopping the %s at %s failed: %s; sending SIGTERM", self.what, self.socket_path, exc)
        stop_process(proc)
