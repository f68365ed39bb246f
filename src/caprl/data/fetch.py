"""Downloading files over HTTP(S): atomic, resumed, retried, verified; a bounded pool; manifests.

Every file goes through :func:`fetch`: bytes arrive in ``<file>.part`` and are renamed onto the
file only once complete and verified; an interrupted download resumes from the ``.part`` file's
size with an HTTP Range request (a server that answers 200 instead of 206 is restarted from zero
cleanly); network errors are retried ``retries`` times with exponential backoff; a checksum
mismatch deletes the bad bytes, names the file and both checksums, and is re-downloaded once.
Files already there are skipped (``verify`` re-hashes them first).

:func:`fetch_all` runs many jobs on a pool of ``workers`` threads; one that fails does not stop
the others. :class:`Downloader` runs batches of :class:`Source` files into one folder and keeps
its two manifests there:

* ``checksums.json`` (:data:`CHECKSUMS`): ``{path under the folder: {url, size, sha256}}``, the
  sha256 computed at the first download of a file that has no published checksum; every later
  download of that file (a deleted file, a mirror given by ``base_url``) must match it.
* ``download_failures.json`` (:data:`FAILURES`): ``{"dataset", "n_jobs", "failed": [{url, dest,
  error}]}``, written atomically after every batch, empty when all succeeded; when some failed the
  batch ends with a CaprlError after the rest are done. Running it again retries them: finished
  files are skipped and partial ones resumed.

Used by ``caprl download`` (:mod:`caprl.data.download`: which files, where, unpacking).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from tqdm import tqdm

from caprl import io
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

CHUNK = 1 << 16
USER_AGENT = "caprl-download/1"
CHECKSUMS = "checksums.json"
FAILURES = "download_failures.json"
RETRYABLE_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Source:
    """One file of a dataset: its URL, its path under the download folder, and what is known about it."""

    url: str
    dest: str
    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    extract: bool = False  # a zip unpacked into the download folder after the download


class DownloadError(CaprlError):
    """A file that could not be downloaded (after its retries); the message names it and why."""


class ChecksumError(DownloadError):
    """Downloaded bytes whose checksum is not the expected one (the bad file is deleted)."""


class _Incomplete(Exception):
    """The connection ended before the announced length: retried, resuming from what arrived."""


@dataclass(frozen=True)
class Job:
    """One download: the URL to fetch (a mirror's, with --base-url), the file, what it must hash to."""

    url: str
    dest: Path
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None


def part_path(dest: Path) -> Path:
    """Where the bytes of ``dest`` arrive until it is complete and verified."""
    return dest.with_name(dest.name + ".part")


def fetch(url: str, dest: str | os.PathLike[str], *, sha256: str | None = None, md5: str | None = None,
          retries: int = 3, backoff: float = 1.0, timeout: float = 60.0,
          progress: Callable[[int], None] | None = None) -> str | None:
    """Download ``url`` to ``dest`` atomically, resuming, retrying and verifying (module docstring).

    Returns the file's sha256, or None when ``dest`` was already there (skipped, not re-hashed).
    ``progress(n)`` is told of every ``n`` bytes received (negative when bytes are thrown away).
    Raises :class:`DownloadError` (a CaprlError) naming the URL and the file when it gives up.
    """
    dest = Path(dest)
    if dest.is_file():
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, tell = part_path(dest), progress or (lambda n: None)
    attempt, bad_checksums = 0, 0
    while True:
        try:
            digests = _download(url, part, timeout, tell, md5 is not None)
            _verify(url, dest, part, digests, sha256, md5, tell)
            os.replace(part, dest)
            return digests["sha256"]
        except ChecksumError as exc:
            bad_checksums += 1
            if bad_checksums > 1:
                raise
            log.warning("%s; downloading it again", exc)
        except (urllib.error.URLError, http.client.HTTPException, ssl.SSLError, ConnectionError, TimeoutError,
                _Incomplete) as exc:
            code = exc.code if isinstance(exc, urllib.error.HTTPError) else None
            if code is not None and (code not in RETRYABLE_HTTP or attempt >= retries):
                raise DownloadError(f"{url} -> {dest}: HTTP {code} {exc.reason}") from None
            if attempt >= retries:
                raise DownloadError(f"{url} -> {dest}: {exc} (gave up after {attempt + 1} attempts; run again to "
                                    "resume)") from None
            attempt = _wait(url, exc, attempt, retries, backoff, part)


def _wait(url: str, exc: BaseException, attempt: int, retries: int, backoff: float, part: Path) -> int:
    delay = backoff * 2 ** attempt
    have = part.stat().st_size if part.exists() else 0
    log.info("%s: %s; retry %d of %d in %.2fs (from byte %d)", url, exc, attempt + 1, retries, delay, have)
    time.sleep(delay)
    return attempt + 1


def _download(url: str, part: Path, timeout: float, tell: Callable[[int], None],
              want_md5: bool) -> dict[str, str]:
    """Append the missing bytes of ``url`` to ``part``; the hex digests of the whole ``part``."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={offset}-"} if offset else {})}
    hashes = {"sha256": hashlib.sha256(), **({"md5": hashlib.md5()} if want_md5 else {})}
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset and (exc.headers.get("Content-Range") or "") == f"bytes */{offset}":
            return hash_file(part, hashes)  # the .part is whole already (stopped before its rename)
        if exc.code == 416 and offset:  # the partial file is longer than the server's: start over
            part.unlink()
            tell(-offset)
            raise _Incomplete(f"HTTP 416 for a resume from byte {offset}; starting over") from None
        raise
    with resp:
        if offset and resp.status == 206:
            start = _range_start(resp.headers.get("Content-Range"))
            if start != offset:
                part.unlink()
                tell(-offset)
                raise _Incomplete(f"asked for bytes from {offset}, got Content-Range "
                                  f"{resp.headers.get('Content-Range')!r}; starting over")
            hash_file(part, hashes)
            mode = "ab"
        else:
            if offset:
                log.info("%s: the server sent the whole file (HTTP %d) for a resume from byte %d; starting over",
                         url, resp.status, offset)
                tell(-offset)
            offset, mode = 0, "wb"
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        received = 0
        with open(part, mode) as fh:
            while chunk := resp.read(CHUNK):
                fh.write(chunk)
                for h in hashes.values():
                    h.update(chunk)
                received += len(chunk)
                tell(len(chunk))
            fh.flush()
            os.fsync(fh.fileno())
    if expected is not None and received < expected:
        raise _Incomplete(f"connection closed after {received} of {expected} bytes")
    return {k: h.hexdigest() for k, h in hashes.items()}


def hash_file(path: Path, hashes: dict[str, Any]) -> dict[str, str]:
    """Feed ``path`` to every hash of ``hashes``; their hex digests so far."""
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            for h in hashes.values():
                h.update(block)
    return {k: h.hexdigest() for k, h in hashes.items()}


def _range_start(content_range: str | None) -> int | None:
    """The first byte of ``Content-Range: bytes START-END/TOTAL``."""
    try:
        return int((content_range or "").split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _verify(url: str, dest: Path, part: Path, digests: dict[str, str], sha256: str | None, md5: str | None,
            tell: Callable[[int], None]) -> None:
    for name, want in (("sha256", sha256), ("md5", md5)):
        if want and digests[name] != want.lower():
            size = part.stat().st_size
            part.unlink(missing_ok=True)
            tell(-size)
            raise ChecksumError(f"{dest}: {name} mismatch: expected {want.lower()}, got {digests[name]} "
                                f"({size} bytes from {url}); the bad download was deleted")


def fetch_all(jobs: Sequence[Job], *, workers: int, retries: int, backoff: float, timeout: float,
              desc: str = "download") -> tuple[dict[Path, str | None], list[dict[str, str]]]:
    """Fetch ``jobs``, at most ``workers`` at once: ``({dest: sha256, None if skipped}, [{url, dest, error}])``.

    A job that fails does not stop the others. The progress bar counts bytes when every size is known, else files.
    """
    sized = bool(jobs) and all(j.size for j in jobs)
    have = sum(p.stat().st_size for j in jobs for p in (j.dest, part_path(j.dest)) if p.is_file()) if sized else 0
    bar = tqdm(total=sum(j.size or 0 for j in jobs) if sized else len(jobs), initial=have, desc=desc,
               unit="B" if sized else "file", unit_scale=sized, mininterval=2.0, disable=None)
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            bar.update(n)

    def run(job: Job) -> str | None:
        return fetch(job.url, job.dest, sha256=job.sha256, md5=job.md5, retries=retries, backoff=backoff,
                     timeout=timeout, progress=on_bytes if sized else None)

    fetched: dict[Path, str | None] = {}
    failed: list[dict[str, str]] = []
    with bar, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
        futures = {pool.submit(run, job): job for job in jobs}
        try:
            for future in as_completed(futures):
                job = futures[future]
                try:
                    fetched[job.dest] = future.result()
                except DownloadError as exc:
                    log.debug("failed: %s", exc)
                    failed.append({"url": job.url, "dest": str(job.dest), "error": str(exc)})
                if not sized:
                    on_bytes(1)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return fetched, sorted(failed, key=lambda f: f["dest"])


def rebase(url: str, base_url: str | None) -> str:
    """``url`` on a mirror: its scheme and host replaced by ``base_url``'s (whose path is prefixed)."""
    if not base_url:
        return url
    base, u = urlsplit(base_url), urlsplit(url)
    return urlunsplit((base.scheme, base.netloc, base.path.rstrip("/") + u.path, u.query, ""))


class Downloader:
    """Runs batches of downloads into one folder, keeping its checksums and failures manifests."""

    def __init__(self, dataset: str, out: Path, *, base_url: str | None = None, workers: int = 8,
                 retries: int = 3, backoff: float = 1.0, timeout: float = 60.0, verify: bool = False) -> None:
        if workers < 1 or retries < 0 or backoff < 0 or timeout <= 0:
            raise CaprlError(f"--workers must be >= 1 (got {workers}), --retries >= 0 (got {retries}), --backoff "
                             f">= 0 (got {backoff}) and --timeout > 0 (got {timeout})")
        self.dataset, self.out, self.base_url, self.verify = dataset, out, base_url, verify
        self.options = {"workers": workers, "retries": retries, "backoff": backoff, "timeout": timeout}
        self.recorded: dict[str, dict[str, Any]] = {}
        if (out / CHECKSUMS).exists():
            self.recorded = io.read_json(out / CHECKSUMS, "checksums manifest")
            if not isinstance(self.recorded, dict):
                raise CaprlError(f"{out / CHECKSUMS}: expected an object {{path: {{url, size, sha256}}}}; delete it")

    def job(self, src: Source) -> Job:
        """The job of one source: its published checksum, else the one recorded at its first download."""
        recorded = self.recorded.get(src.dest, {}).get("sha256") if not (src.sha256 or src.md5) else None
        return Job(rebase(src.url, self.base_url), self.out / src.dest, src.sha256 or recorded, src.md5, src.size)

    def run(self, sources: Sequence[Source], desc: str) -> dict[Path, str | None]:
        """Download ``sources``; record new checksums; write the failures manifest; raise if any failed."""
        jobs = [self.job(src) for src in sources]
        if self.verify:
            for job in jobs:
                self._check_existing(job)
        fetched, failed = fetch_all(jobs, desc=desc, **self.options)
        new = {src.dest: {"url": src.url, "size": job.dest.stat().st_size, "sha256": fetched[job.dest]}
               for src, job in zip(sources, jobs)
               if fetched.get(job.dest) and not (src.sha256 or src.md5) and src.dest not in self.recorded}
        if new:
            self.recorded.update(new)
            io.write_json(self.out / CHECKSUMS, dict(sorted(self.recorded.items())))
        io.write_json(self.out / FAILURES, {"dataset": self.dataset, "n_jobs": len(jobs), "failed": failed})
        got = sum(sha is not None for sha in fetched.values())
        log.info("%s: %d downloaded, %d already there, %d failed", desc, got, len(fetched) - got, len(failed))
        if failed:
            raise CaprlError(f"{len(failed)} of {len(jobs)} downloads failed, e.g. {failed[0]['error']}; all are "
                             f"listed in {self.out / FAILURES}. Run the same command again to retry them (finished "
                             "files are skipped, partial ones resumed)")
        return fetched

    def _check_existing(self, job: Job) -> None:
        if not job.dest.is_file() or not (job.sha256 or job.md5):
            return
        algo, want = ("sha256", job.sha256) if job.sha256 else ("md5", job.md5)
        got = hash_file(job.dest, {algo: hashlib.new(algo)})[algo]
        if got != str(want).lower():
            log.warning("%s: %s %s, expected %s; deleted, downloading it again", job.dest, algo, got, want)
            job.dest.unlink()
