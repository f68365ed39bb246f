"""Atomic file output: a killed job leaves the old file or none, never a half-written one.

A temporary file is named ``.<name>.<pid>@<host>~<random>.tmp`` beside its target, so the
next writer of the same target finds the ones a killed process left (SIGKILL, out of memory,
a node lost) and removes them: on this host when their process is gone, from another host
(or of the older ``.<name>.<random>.tmp`` form) once untouched for :data:`STALE_AFTER_S`.
Text inputs are read by :func:`read_text`: bad bytes are an error naming the file and line.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

_UMASK = os.umask(0)
os.umask(_UMASK)

STALE_AFTER_S = 15 * 60  # a live writer touches its temporary file far more often than this
HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"
_OWNED = re.compile(r"(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)~[A-Za-z0-9]+")
_LEGACY = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkstemp's names, before the owner was in the name


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _is_stale(path: Path, middle: str) -> bool:
    """Whether the temporary file ``path`` (``middle``: its name between target and ``.tmp``)
    was left by a writer that is gone."""
    owned = _OWNED.fullmatch(middle)
    if owned and owned["host"] == HOST:
        return int(owned["pid"]) != os.getpid() and not _pid_running(int(owned["pid"]))
    if owned or _LEGACY.fullmatch(middle):
        try:
            return time.time() - path.stat().st_mtime > STALE_AFTER_S
        except FileNotFoundError:
            return False
    return False  # not a temporary file of this target (e.g. of a target whose name extends it)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of ``path`` that killed writers left; returns them."""
    target = Path(path)
    prefix = f".{target.name}."
    removed = []
    for tmp in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        if tmp.is_file() and _is_stale(tmp, tmp.name[len(prefix):-len(".tmp")]):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
            log.info("removed %s, left by a killed writer of %s", tmp, target)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    The temporary file lives in the same directory so that ``os.replace`` is atomic.
    On any exception the temporary file is removed and ``path`` is left untouched; the
    temporary files of earlier writers of ``path`` that were killed are removed first.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    tmp_path = target.parent / f".{target.name}.{os.getpid()}@{HOST}~{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any output
    os.close(fd)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def not_utf8_message(path: Path, data: bytes, exc: UnicodeDecodeError, what: str = "file") -> str:
    """Where the first bad byte of ``data`` (the content of ``path``) is, and what to do."""
    start = exc.start
    line = data.count(b"\n", 0, start) + 1
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    near = data[max(0, start - 30):start + 30].decode("utf-8", "replace")
    source = "latin1"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        source = "utf-16"  # a byte-order mark: saved as "Unicode" by a Windows editor
    return (f"{path}: line {line}, column {column} (byte offset {start}): byte 0x{data[start]:02x} is not UTF-8 "
            f"({exc.reason}), near {near!r}; the {what} must be UTF-8 text: re-encode it from the encoding it "
            f"was saved in ({source}?), e.g. "
            f"`iconv -f {source} -t utf-8 {path} > {path}.utf8 && mv {path}.utf8 {path}`")


def read_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """Read a UTF-8 text file; bad bytes are a CaprlError naming the file, line and byte offset."""
    from caprl.errors import CaprlError

    p = Path(path)
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaprlError(not_utf8_message(p, data, exc, what)) from None


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Read JSON, turning a missing file, bytes that are not UTF-8 or a syntax error into a
    CaprlError naming the line."""
    from caprl.errors import CaprlError

    p = Path(path)
    if not p.exists():
        raise CaprlError(f"{what} not found: {p}")
    text = read_text(p, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaprlError(f"{p}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>-])/[^\s,;:()'\"\[\]]+")
_PACKAGE_DIRS = ("site-packages", "dist-packages")


def _portable_path(match: re.Match[str]) -> str:
    path = Path(match.group(0))
    for i, part in enumerate(path.parts):
        if part in _PACKAGE_DIRS:
            return "/".join(("<python packages>",) + path.parts[i + 1:])
    try:
        return path.relative_to(Path.cwd()).as_posix() or "."
    except ValueError:
        return "/".join(("…",) + path.parts[-2:])


def portable(text: str) -> str:
    """``text`` with this machine's absolute paths made machine-independent: relative to the
    working directory (the repository root), ``<python packages>/...`` for installed
    packages, or ``…/<parent>/<name>`` otherwise — tables are committed and compared."""
    return _ABSOLUTE_PATH.sub(_portable_path, text)
