"""One long-lived SPICE process (``SpiceServer.java`` beside this file), for rewards and evaluation.

pycocoevalcap runs ``java -jar spice-1.0.jar`` once per call: a JVM start and a Stanford
CoreNLP model load each time, far too slow for an RL reward (and on Java 15+ its output
step needs the removed Nashorn engine; on Java 16+ its LMDB cache fails to serialise).
:class:`SpiceServer` starts ``java -cp <jars> SpiceServer.java`` (Java 11+ runs a single
source file; no build step) at the first request, keeps it, and restarts it once if it died.

Protocol: the process prints ``ready``; each request is one stdin line
``<input.json>\\t<output.json>`` (SPICE's own input format); the answer is one stdout line,
``ok <count>`` (the output file then holds SPICE's per-item JSON) or ``error <message>``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import select
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("SpiceServer.java")


class SpiceFailed(CaprlError):
    """The SPICE process failed (the message says how, with the end of its stderr)."""


class _Died(Exception):
    """The process ended or stopped answering (a restart may help)."""


@functools.cache
def java_major_version(java: str = "java") -> int:
    """The major version of ``java`` (8 for "1.8.0_x", 17 for "17.0.x"); 0 if unknown."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return 0
    match = re.search(r'version "(?:1\.)?(\d+)', out)
    return int(match.group(1)) if match else 0


def java_command(
    classpath: Sequence[Path],
    *,
    java: str = "java",
    memory: str = "8G",
    threads: int | None = None,
    synsets: bool = True,
    subset: bool = False,
) -> list[str]:
    """The command line that starts the SPICE server over ``classpath`` (jars)."""
    version = java_major_version(java)
    if version and version < 11:
        raise SpiceFailed(f"SPICE's server needs Java 11+ (single-file source launch); {java} is Java {version}")
    command = [java, f"-Xmx{memory}"]
    if version >= 12:  # lets SpiceServer.java install its System.exit guard (refused by default on 18+)
        command.append("-Djava.security.manager=allow")
    command += ["-cp", os.pathsep.join(str(p) for p in classpath), str(SOURCE)]
    if threads is not None:
        command += ["-threads", str(int(threads))]
    if not synsets:
        command.append("-noSynsets")
    if subset:
        command.append("-subset")
    return command


class SpiceServer:
    """A SPICE JVM started at the first request and kept until :meth:`close`.

    ``command`` is the process to run (:func:`java_command`). ``startup_timeout`` and
    ``request_timeout`` (seconds) bound the wait for ``ready`` and for each answer.
    """

    def __init__(self, command: Sequence[str], *, startup_timeout: float = 900.0, request_timeout: float = 3600.0):
        self.command = list(command)
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self.starts = 0  # how many processes were started (restarts included)

    # -- public -------------------------------------------------------------------------
    def score(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, dict[str, float]]]:
        """SPICE scores of ``(candidate, references)`` pairs: per item ``{"All": {"f", "pr", "re", ...}, ...}``.

        Values SPICE leaves undefined come back as NaN (as in pycocoevalcap).
        """
        if not items:
            return []
        for attempt in (1, 2):
            try:
                return self._request(items)
            except _Died as exc:
                tail = self._stderr_tail()
                self._stop()
                if attempt == 2:
                    message = f"SPICE's Java process failed twice ({exc}); its stderr ends with:\n{tail}"
                    raise SpiceFailed(message) from None
                log.warning("SPICE's Java process died (%s); restarting it once", exc)
        raise AssertionError("unreachable")

    def f_scores(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[float]:
        """The SPICE F-score (all tuples) of each ``(candidate, references)`` pair."""
        return [scores["All"]["f"] for scores in self.score(items)]

    def close(self) -> None:
        """Stop the process (if running) and remove its files. Safe to call more than once."""
        self._stop()

    def __enter__(self) -> SpiceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop()

    # -- process ------------------------------------------------------------------------
    def _start(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="caprl-spice-")
        self._stderr = open(Path(self._workdir.name) / "stderr.log", "wb")  # noqa: SIM115 (closed in _stop)
        self._buffer = b""
        self.starts += 1
        try:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, bufsize=0
            )
        except OSError as exc:
            self._stop()
            raise SpiceFailed(f"cannot start SPICE ({self.command[0]}): {exc}") from exc
        line = self._read_line(self.startup_timeout)
        if line != "ready":
            raise _Died(f"it answered {line!r} instead of 'ready' at start-up")

    def _request(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, dict[str, float]]]:
        if self._proc is None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None and self._workdir is not None
        folder = Path(self._workdir.name)
        in_path, out_path = folder / "in.json", folder / "out.json"
        payload = [{"image_id": i, "test": test, "refs": list(refs)} for i, (test, refs) in enumerate(items)]
        in_path.write_text(json.dumps(payload), encoding="utf-8")
        out_path.unlink(missing_ok=True)
        try:
            self._proc.stdin.write(f"{in_path}\t{out_path}\n".encode())
            self._proc.stdin.flush()
        except OSError as exc:
            raise _Died(f"writing the request failed: {exc}") from None
        answer = self._read_line(self.request_timeout)
        if answer.startswith("error "):
            raise SpiceFailed(f"SPICE could not score the batch: {answer[6:]}")
        if answer != f"ok {len(items)}":
            raise _Died(f"unexpected answer {answer!r}")
        results = json.loads(out_path.read_text(encoding="utf-8"))
        by_id = {int(entry["image_id"]): entry["scores"] for entry in results}
        if sorted(by_id) != list(range(len(items))):
            raise SpiceFailed(f"SPICE answered for {len(by_id)} item(s) instead of {len(items)}")
        return [
            {cat: {k: _float(v) for k, v in values.items()} for cat, values in by_id[i].items()}
            for i in range(len(items))
        ]

    def _read_line(self, timeout: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise _Died(f"no answer within {timeout:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self._proc.poll()
                raise _Died("it exited" + (f" with status {code}" if code is not None else ""))
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace").strip()

    def _stderr_tail(self, lines: int = 15) -> str:
        if self._workdir is None:
            return ""
        path = Path(self._workdir.name) / "stderr.log"
        with contextlib.suppress(OSError):
            if self._stderr is not None:
                self._stderr.flush()
            return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    assert proc.stdin is not None
                    proc.stdin.write(b"quit\n")
                    proc.stdin.flush()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


def _float(value: Any) -> float:
    """A SPICE number as float; None/NaN strings become NaN (pycocoevalcap's ``float_convert``)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
