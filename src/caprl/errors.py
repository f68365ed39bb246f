"""User-facing errors: the CLI prints their message (no traceback) and exits 2."""

from __future__ import annotations

import errno as errno_codes
import os
import shutil
from pathlib import Path

#: errors only a write gives: a full disk, a used-up quota, a file-size limit, a read-only filesystem
DISK_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG, errno_codes.EROFS})
#: the errors of a write that the user, not caprl, must fix: those, or a folder they may not write in
WRITE_ERRNOS = DISK_ERRNOS | {errno_codes.EACCES, errno_codes.EPERM}


class CaprlError(Exception):
    """An error caused by the user's input (params, data files, checkpoints).

    The message must say which file/key/line is wrong and what to do about it.
    """


class WriteError(CaprlError):
    """A file could not be written (disk full, quota, file-size limit, read-only or forbidden).

    The message names the file, the cause (``os.strerror``, or a guess when the writer hid the
    error: ``errno`` None), what to do about it and the free space of the file's filesystem.
    ``what`` describes the file ("the PTB tokenizer's temporary file"); ``detail`` is appended
    (e.g. "the previous file is unchanged", or a library's own message).
    """

    def __init__(self, path: str | os.PathLike[str] | None, errno: int | None, detail: str = "",
                 what: str = "") -> None:
        self.path = Path(path) if path is not None else None
        self.errno = errno
        super().__init__(write_message(self.path, errno, detail, what))


def free_space(path: Path) -> int | None:
    """Free bytes (for this user) on the filesystem of ``path`` or its nearest existing folder."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (``ulimit -f``), None when unlimited."""
    try:
        import resource
    except ImportError:  # not Unix
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _remedy(path: Path | None, errno: int | None) -> str:
    folder = Path.cwd() if path is None else path if path.is_dir() else path.parent
    if errno == errno_codes.ENOSPC:
        return "its filesystem is full: free space there, or write to another disk"
    if errno == errno_codes.EDQUOT:
        return "your disk quota there is used up (`quota -s` shows it): delete files, or write elsewhere"
    if errno == errno_codes.EFBIG:
        limit = file_size_limit()
        if limit is not None:
            return (f"this process may write files of at most {limit} bytes (`ulimit -f` {limit // 1024}): "
                    "raise the limit (`ulimit -f unlimited`, or the job's file-size limit)")
        return "the file is larger than its filesystem allows: write it to another filesystem"
    if errno == errno_codes.EROFS:
        return "its filesystem is mounted read-only: write it elsewhere"
    if errno in (errno_codes.EACCES, errno_codes.EPERM):
        return f"you may not write in {folder}: change its permissions, or write elsewhere"
    return "the write failed (disk full or file-size limit?)"


def write_message(path: Path | None, errno: int | None, detail: str = "", what: str = "") -> str:
    """``could not write <what> <path> (<strerror>): <remedy>; free N MB on its filesystem; <detail>``."""
    subject = " ".join(s for s in (what, str(path) if path is not None else "") if s) or "a file"
    cause = f" ({os.strerror(errno)})" if errno is not None else ""
    parts = [f"could not write {subject}{cause}: {_remedy(path, errno)}"]
    free = free_space(path if path is not None else Path.cwd())
    if free is not None:
        parts.append(f"free {free // 10**6} MB on its filesystem")
    if detail:
        parts.append(detail)
    return "; ".join(parts)
