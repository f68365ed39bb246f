"""Atomic file output: a killed job leaves the old file or none, never a half-written one.

A temporary file is named ``.<name>.<pid>@<host>~<random>.tmp`` beside its target, so the
next writer of the same target finds the ones a killed process left (SIGKILL, out of memory,
a node lost) and removes them: on this host when their process is gone, from another host
(or of the older ``.<name>.<random>.tmp`` form) once untouched for :data:`STALE_AFTER_S`.
Text inputs are read by :func:`read_text`: bad bytes are an error naming the file and line.

A write that fails for a reason the user must fix (disk full, quota, file-size limit, read-only
or forbidden folder: :data:`caprl.errors.WRITE_ERRNOS`) is a :class:`caprl.errors.WriteError`
naming the file, the cause and the free space; the target is left as it was, the temporary
file removed. HDF5 outputs go through :func:`atomic_hdf5`, which also closes the file safely.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import re
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from caprl.errors import DISK_ERRNOS, WRITE_ERRNOS, CaprlError, WriteError, file_size_limit, free_space

if TYPE_CHECKING:
    import h5py

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
    temporary files of earlier writers of ``path`` that were killed are removed first. A
    failed write of this file (:data:`caprl.errors.WRITE_ERRNOS`, raised in the body or here)
    becomes a :class:`caprl.errors.WriteError` naming ``path``.
    """
    target = Path(path)
    tmp_path = target.parent / f".{target.name}.{os.getpid()}@{HOST}~{secrets.token_hex(4)}.tmp"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any output
        os.close(fd)
    except OSError as exc:
        error = _target_write_error(exc, target, tmp_path)
        if error is None:
            raise
        raise error from exc
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())  # a full disk may show only here (delayed allocation, NFS)
        os.replace(tmp_path, target)
    except BaseException as exc:
        tmp_path.unlink(missing_ok=True)
        error = None if isinstance(exc, WriteError) else _target_write_error(exc, target, tmp_path)
        if error is None:
            raise
        raise error from exc


def write_cause(exc: BaseException) -> tuple[int, str | None] | None:
    """``(errno, file name or None)`` when ``exc`` or an exception it was raised from is a failed
    write (:data:`caprl.errors.WRITE_ERRNOS`): an ``OSError``, or an HDF5 error whose message
    says ``errno = N``; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_ERRNOS:
            return current.errno, current.filename2 or current.filename  # a copy's or rename's: its destination
        found = _HDF5_ERRNO.search(str(current))
        if found and int(found["errno"]) in WRITE_ERRNOS:
            return int(found["errno"]), found["file"]
        current = current.__cause__ or current.__context__
    return None


_HDF5_ERRNO = re.compile(r"(?:filename = '(?P<file>[^']*)'.*?)?\berrno = (?P<errno>\d+)", re.DOTALL)


def _target_write_error(exc: BaseException, target: Path, tmp: Path) -> WriteError | None:
    """``exc`` as a WriteError naming ``target``, if it is a failed write of ``target`` (its
    temporary file ``tmp`` or its folders); None for anything else (e.g. an input not readable)."""
    cause = write_cause(exc)
    if cause is None:
        return None
    code, filename = cause
    if filename is not None and Path(filename) not in {target, tmp, *target.parents}:
        return None  # another file failed: not this output's error to report
    return WriteError(target, code, detail=left_as_it_was(target))


def left_as_it_was(target: Path) -> str:
    """What a failed atomic write of ``target`` left there (for a WriteError's message)."""
    return "the previous file is unchanged" if target.exists() else "nothing was left in its place"


def write_error(exc: BaseException) -> WriteError | None:
    """A write that failed on a full disk, a quota, a file-size limit or a read-only filesystem,
    outside :func:`atomic_path`, as a WriteError naming its file (when known); None otherwise
    (a permission error here may as well be a read's)."""
    cause = write_cause(exc)
    if cause is None or cause[0] not in DISK_ERRNOS:
        return None
    return WriteError(cause[1], cause[0])


FULL_BELOW = 1 << 20  # bytes: a filesystem with less free space than this counts as full


def guess_write_errno(path: Path) -> int | None:
    """Why a write to ``path`` failed when the writer did not say (torch's zip writer): EFBIG if
    the file reached the file-size limit, ENOSPC if its filesystem is (nearly) full, else None."""
    limit = file_size_limit()
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    if limit is not None and size is not None and size >= limit:
        return errno.EFBIG
    free = free_space(path)
    return errno.ENOSPC if free is not None and free < FULL_BELOW else None


@contextlib.contextmanager
def atomic_hdf5(path: str | os.PathLike[str]) -> Iterator["h5py.File"]:
    """An HDF5 file open for writing, moved onto ``path`` only on success (see :func:`atomic_path`).

    HDF5 writes its caches when the file is flushed or closed. A close whose writes fail (a
    full disk) leaves the file half-closed inside HDF5, and the library's teardown at exit then
    crashes the process (segmentation fault). So the file is flushed first, and if the body or
    that flush fails, its descriptor is pointed at /dev/null before the close: HDF5 closes it
    writing nothing, and no h5py object is left open at exit. Always closed before the
    temporary file is removed.
    """
    import h5py

    with atomic_path(path) as tmp:
        h5 = h5py.File(tmp, "w")
        flushed = False
        try:
            yield h5
            h5.flush()
            flushed = True
        finally:
            if not flushed:
                _discard_pending_writes(h5)
            h5.close()


def hdf5_files_left_open() -> bool:
    """Whether HDF5 still holds a file open for writing (one whose close failed: a writer that
    is not :func:`atomic_hdf5`); HDF5's teardown at interpreter exit would then crash."""
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return False
    files = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
    return any(fid.get_intent() & h5py.h5f.ACC_RDWR for fid in files)


def _discard_pending_writes(h5: "h5py.File") -> None:
    """Make what HDF5 still has to write to ``h5`` go to /dev/null (so that its close succeeds)."""
    with contextlib.suppress(Exception):  # not the sec2 driver: nothing to redirect
        fd = h5.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


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
    p = Path(path)
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaprlError(not_utf8_message(p, data, exc, what)) from None


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Read JSON, turning a missing file, bytes that are not UTF-8 or a syntax error into a
    CaprlError naming the line."""
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
