"""``caprl setup-spice``: install SPICE's Stanford CoreNLP 3.6.0 jars from Maven Central.

SPICE needs ``stanford-corenlp-3.6.0.jar`` and ``stanford-corenlp-3.6.0-models.jar``
(:data:`~caprl.metrics.official.CORENLP_JARS`): the Maven artifact
``edu.stanford.nlp:stanford-corenlp:3.6.0``, its plain jar and its ``models`` classifier.

Where they go: ``--dest DIR``, else params ``spice.corenlp_dir``, else ``$CAPRL_CORENLP_DIR``, else
pycocoevalcap's ``spice/lib``: the folders :func:`~caprl.metrics.official.spice_classpath` looks
in, in its order.

How, for each jar: a HEAD request (HTTP 404: the repository lacks the artifact), then the checksum
published beside it; the bytes arrive in ``--download-dir`` through :func:`caprl.data.fetch.fetch`
(a ``.part`` file resumed with HTTP Range, restarted from zero when the server ignores Range,
retried with backoff), are hashed, and are deleted on a mismatch. Only when both jars are verified
does each enter the destination, by an atomic rename (:func:`caprl.io.atomic_path`): the
destination never holds a partial or unverified jar. A jar already there that matches its
checksum is kept.

Checksums: of ``.sha512``, ``.sha256``, ``.sha1`` and ``.md5`` (strongest first) the first one the
repository has is used. Maven Central has ``.sha1`` and ``.md5`` beside every file, and the
stronger ones only for some newer artifacts. A checksum from the same server catches a damaged,
truncated or wrong file, not a forged one (the ``.asc`` PGP signatures are not checked).

Pinned digests: :data:`PINNED` holds, per jar, digests written into this code (``sha256``,
``sha1``, ...); each is checked too, whatever the repository publishes, so a mirror or proxy that
serves another file with a matching checksum beside it is refused (the file deleted, nothing
installed), and so is a jar already in the destination that does not match. A jar without a
pinned digest is checked against its repository's checksum only, with a warning. Today the table
is empty: no authoritative digest of the 3.6.0 jars could be read where this was written (no route
to Maven Central; no public lock file found that pins them), and none was guessed. To pin them, on
a machine that reaches Maven Central::

    curl -sO https://repo1.maven.org/maven2/edu/stanford/nlp/stanford-corenlp/3.6.0/stanford-corenlp-3.6.0.jar
    curl -s  https://repo1.maven.org/maven2/edu/stanford/nlp/stanford-corenlp/3.6.0/stanford-corenlp-3.6.0.jar.sha1
    sha1sum stanford-corenlp-3.6.0.jar && sha256sum stanford-corenlp-3.6.0.jar   # and the same for -models.jar

and enter both digests of each jar (the sha1 equal to Maven Central's ``.sha1``) in :data:`PINNED`.
:func:`install` takes the table as an argument (``pinned``): the tests pin their own jars' digests.

Network: the standard library's urllib only, which honours ``HTTPS_PROXY``, ``HTTP_PROXY`` and
``NO_PROXY``. A mirror or a repository manager that proxies Maven Central: ``--repo URL`` or
``$CAPRL_MAVEN_REPO``. Where no repository can be reached, the error says which two files to
download by hand and where to copy them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import logging
import os
import shutil
import string
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tqdm import tqdm

from caprl import io
from caprl.data.fetch import RETRYABLE_HTTP, USER_AGENT, ChecksumError, DownloadError, fetch, hash_file, part_path
from caprl.errors import WRITE_ERRNOS, CaprlError, WriteError
from caprl.metrics.official import CORENLP_ENV, CORENLP_JARS, _package_dir, spice_unavailable_reason

log = logging.getLogger(__name__)

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
REPO_ENV = "CAPRL_MAVEN_REPO"
ARTIFACT = "edu.stanford.nlp:stanford-corenlp:3.6.0"
ARTIFACT_PATH = "edu/stanford/nlp/stanford-corenlp/3.6.0"
#: the checksums Maven repositories publish beside a file, strongest first: name -> hex digits
DIGESTS = {"sha512": 128, "sha256": 64, "sha1": 40, "md5": 32}
#: jar name -> {algorithm: hex digest} of Maven Central's file, written into this code and checked
#: beside the repository's own checksum (module docstring): empty, as no authoritative value was found
PINNED: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class Network:
    """How requests are made: ``retries`` after the first try, ``backoff`` seconds doubled each time."""

    retries: int = 3
    backoff: float = 1.0
    timeout: float = 60.0


class Unreachable(CaprlError):
    """The repository could not be reached (no network, a firewall, a proxy needed)."""


def jar_urls(repo: str) -> dict[str, str]:
    """Jar name -> its URL in the Maven repository ``repo``."""
    return {name: f"{repo.rstrip('/')}/{ARTIFACT_PATH}/{name}" for name in CORENLP_JARS}


def repository(repo: str | None = None) -> str:
    """``repo``, else ``$CAPRL_MAVEN_REPO``, else Maven Central; CaprlError if it is not an http(s) URL."""
    url = (repo or os.environ.get(REPO_ENV) or MAVEN_CENTRAL).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        where = "--repo" if repo else f"${REPO_ENV}"
        raise CaprlError(f"{where} {url!r}: not an http(s) URL of a Maven repository, e.g. {MAVEN_CENTRAL}")
    return url


def install_dir(dest: str | os.PathLike[str] | None = None, corenlp_dir: str | None = None) -> Path:
    """Where the jars go: ``dest``, else ``corenlp_dir`` (params), else ``$CAPRL_CORENLP_DIR``, else
    pycocoevalcap's ``spice/lib``."""
    chosen = dest or corenlp_dir or os.environ.get(CORENLP_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return _package_dir("pycocoevalcap.spice.spice") / "lib"


def default_download_dir() -> Path:
    """``$XDG_CACHE_HOME/caprl/corenlp-3.6.0`` (``~/.cache`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "caprl" / "corenlp-3.6.0"


def manual_route(repo: str, dest: Path) -> str:
    """What to download from where and copy where, for a machine that cannot reach ``repo``."""
    urls = list(jar_urls(repo).values())
    central = list(jar_urls(MAVEN_CENTRAL).values())
    also = f" (on Maven Central: {' and '.join(central)})" if urls != central else ""
    return (f"to install them by hand, download {' and '.join(urls)}{also}, check each against the .sha1 file "
            f"beside it, and copy both into {dest} (or into any folder and set params spice.corenlp_dir or "
            f"${CORENLP_ENV} to it); behind a proxy set HTTPS_PROXY (urllib honours it), or name a Maven mirror "
            f"with --repo URL or ${REPO_ENV}")


def pins_of(name: str, pinned: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """``name``'s pinned digests ({algorithm: lower-case hex}); CaprlError for a malformed entry."""
    pins = {algo: value.lower() for algo, value in pinned.get(name, {}).items()}
    for algo, value in pins.items():
        if algo not in DIGESTS or len(value) != DIGESTS[algo] or not set(value) <= set(string.hexdigits):
            raise CaprlError(f"the pinned {algo} of {name} ({value!r}) is not a {'/'.join(DIGESTS)} hex digest")
    return pins


def install(dest: str | os.PathLike[str], repo: str | None = None, download_dir: str | os.PathLike[str] | None = None,
            network: Network = Network(), pinned: Mapping[str, Mapping[str, str]] = PINNED) -> list[Path]:
    """Download, verify and install both CoreNLP jars into ``dest`` (module docstring); their paths.
    ``pinned``: each jar's digests that must match whatever the repository publishes (:data:`PINNED`)."""
    if network.retries < 0 or network.backoff < 0 or network.timeout <= 0:
        raise CaprlError(f"--retries must be >= 0 (got {network.retries}), --backoff >= 0 (got {network.backoff}) "
                         f"and --timeout > 0 (got {network.timeout})")
    repo = repository(repo)
    dest = Path(dest).expanduser()
    cache = Path(download_dir).expanduser() if download_dir else default_download_dir()
    if cache.resolve() == dest.resolve():
        raise CaprlError(f"--download-dir {cache} is the destination: its partial downloads would lie where SPICE "
                         "looks for the jars; choose another folder")
    check_writable(dest, "the CoreNLP jars' folder",
                   f"install them elsewhere with --dest DIR and set params spice.corenlp_dir or ${CORENLP_ENV} to it")
    check_writable(cache, "the download folder", "choose another one with --download-dir DIR")
    hint = manual_route(repo, dest)
    try:
        downloaded: dict[str, Path] = {}
        for name, url in jar_urls(repo).items():
            pins = pins_of(name, pinned)
            if not pins:
                log.warning("%s has no pinned digest in caprl: it is checked against %s's own checksum only", name, repo)
            size = _probe(url, network, hint)
            algo, want = published_checksum(url, network, hint)
            target = dest / name
            if target.is_file() and _matches(_digests(target, {algo, *pins}), {algo: want}, pins):
                log.info("%s is already installed (its %s matches %s.%s%s)", target, algo, url, algo,
                         f" and its pinned {', '.join(pins)}" if pins else "")
                continue
            downloaded[name] = _download(url, cache / name, algo, want, pins, size, network, hint)
        for name, path in downloaded.items():  # both verified: now into the destination, each by one rename
            with io.atomic_path(dest / name) as tmp:
                shutil.move(str(path), str(tmp))
            log.info("installed %s", dest / name)
    finally:
        with contextlib.suppress(OSError):
            cache.rmdir()  # only when empty: nothing to resume
    return [dest / name for name in CORENLP_JARS]


def check_writable(folder: Path, what: str, instead: str) -> None:
    """Create ``folder`` and a file in it (then removed): a clear CaprlError before any download if it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".caprl-setup-spice.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:
            raise WriteError(folder, exc.errno, detail=instead, what=what) from None
        raise CaprlError(f"could not write {what} {folder} ({exc.strerror or exc}): {instead}") from None


def _request(url: str, network: Network, hint: str, method: str = "GET") -> http.client.HTTPResponse | None:
    """The open response to ``url`` (None on HTTP 404), retried as :func:`caprl.data.fetch.fetch` retries."""
    attempt = 0
    while True:
        try:
            request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT})
            return urllib.request.urlopen(request, timeout=network.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                return None
            if exc.code not in RETRYABLE_HTTP or attempt >= network.retries:
                raise CaprlError(f"{url}: HTTP {exc.code} {exc.reason} from the repository; {hint}") from None
            reason: object = f"HTTP {exc.code}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if attempt >= network.retries:
                raise Unreachable(f"could not reach {url} ({reason}; {attempt + 1} attempt(s)); {hint}") from None
        delay = network.backoff * 2 ** attempt
        log.info("%s: %s; retry %d of %d in %.2fs", url, reason, attempt + 1, network.retries, delay)
        time.sleep(delay)
        attempt += 1


def _probe(url: str, network: Network, hint: str) -> int | None:
    """The jar's size by a HEAD request (None if not announced); CaprlError if the repository lacks it."""
    try:
        response = _request(url, network, hint, method="HEAD")
    except Unreachable:
        raise
    except CaprlError:  # HEAD refused (405, 501) or another HTTP error: the checksum's GET will tell
        return None
    if response is None:
        raise CaprlError(f"{url}: HTTP 404 Not Found: the repository (a mirror?) may lack the artifact {ARTIFACT}"
                         f"; check --repo / ${REPO_ENV}, or {hint}")
    with response:
        length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def published_checksum(url: str, network: Network, hint: str) -> tuple[str, str]:
    """``(algorithm, hex digest)`` of the strongest checksum published beside ``url`` (:data:`DIGESTS`)."""
    for algo, digits in DIGESTS.items():
        response = _request(f"{url}.{algo}", network, hint)
        if response is None:
            continue
        with response:
            body = response.read(4096)
        words = body.decode("ascii", "replace").split()  # "<hex>" or "<hex>  <file name>"
        value = words[0].lower() if words else ""
        if len(value) != digits or not set(value) <= set(string.hexdigits):
            raise CaprlError(f"{url}.{algo}: not a {algo} checksum (it starts {body[:60]!r}); the repository may "
                             "answer missing files with a page: check --repo")
        return algo, value
    names = ", ".join(f".{algo}" for algo in DIGESTS)
    raise CaprlError(f"{url}: the repository publishes no checksum beside it (HTTP 404 for {names}), so a download "
                     f"could not be verified; the mirror may lack the artifact {ARTIFACT}: check --repo, or {hint}")


def _matches(got: dict[str, str], *wanted: dict[str, str]) -> bool:
    return all(got[algo] == value for want in wanted for algo, value in want.items())


def _digests(path: Path, algos: set[str]) -> dict[str, str]:
    """Every digest of ``algos`` of ``path``, in one read."""
    return hash_file(path, {algo: hashlib.new(algo) for algo in sorted(algos)})


def _download(url: str, cached: Path, algo: str, want: str, pins: dict[str, str], size: int | None,
              network: Network, hint: str) -> Path:
    """``url`` into ``cached`` (resumed from ``cached.part``), checked against the published ``want`` and
    every pinned digest of ``pins``; the bad file deleted."""
    part = part_path(cached)
    have = part.stat().st_size if part.is_file() else 0
    if have:
        log.info("resuming %s from byte %d (%s)", url, have, part)
    bar = tqdm(total=size, initial=have, desc=cached.name, unit="B", unit_scale=True, mininterval=2.0, disable=None)
    try:
        with bar:
            fetch(url, cached, retries=network.retries, backoff=network.backoff, timeout=network.timeout,
                  progress=bar.update)
    except DownloadError as exc:
        kept = f"; the bytes received are kept in {part}" if part.is_file() else ""
        raise CaprlError(f"{exc}{kept}: run `caprl setup-spice` again to resume, or {hint}") from None
    got = _digests(cached, {algo, *pins})
    if got[algo] != want:
        cached.unlink(missing_ok=True)
        raise ChecksumError(f"{cached}: {algo} mismatch: {url}.{algo} says {want}, the downloaded file hashes to "
                            f"{got[algo]}; the bad file was deleted. Run `caprl setup-spice` again; if it fails again "
                            f"the repository serves a damaged file: use another --repo, or {hint}")
    for pin, value in pins.items():
        if got[pin] != value:
            cached.unlink(missing_ok=True)
            raise ChecksumError(f"{cached}: {pin} mismatch against the digest caprl pins for {cached.name}: pinned "
                                f"{value}, the downloaded file hashes to {got[pin]} (its {algo} matches {url}.{algo}: "
                                f"the repository serves another file than Maven Central's {ARTIFACT}); the file was "
                                f"deleted and nothing installed. Use another --repo, or {hint}")
    log.info("%s: %s verified (%s)%s", cached.name, algo, want,
             f"; pinned {', '.join(f'{k} {v}' for k, v in pins.items())} verified" if pins else "")
    return cached


def _params_corenlp_dir(paths: list[str]) -> str | None:
    """params ``spice.corenlp_dir``; None when the default params.yaml is absent (run outside a checkout)."""
    if paths == ["params.yaml"] and not Path("params.yaml").exists():
        return None
    from caprl import params

    return params.load(paths)["spice"]["corenlp_dir"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", default=None, metavar="DIR",
                        help="folder to install the two jars in (default: params spice.corenlp_dir, else "
                             f"${CORENLP_ENV}, else pycocoevalcap's spice/lib: where SPICE looks for them)")
    parser.add_argument("--repo", default=None, metavar="URL",
                        help=f"Maven repository or mirror (default: ${REPO_ENV}, else {MAVEN_CENTRAL}); "
                             "HTTPS_PROXY, HTTP_PROXY and NO_PROXY are honoured (urllib)")
    parser.add_argument("--download-dir", default=None, metavar="DIR",
                        help="where the jars are downloaded and an interrupted download is kept to be resumed "
                             "(default: $XDG_CACHE_HOME/caprl/corenlp-3.6.0, ~/.cache when unset)")
    parser.add_argument("--retries", type=int, default=3, help="retries of a failed request (default 3)")
    parser.add_argument("--backoff", type=float, default=1.0,
                        help="seconds before the first retry, doubled for each next one (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a retry (default 60)")


def main(args: argparse.Namespace) -> None:
    corenlp_dir = None if args.dest else _params_corenlp_dir(args.params)
    dest = install_dir(args.dest, corenlp_dir)
    install(dest, repo=args.repo, download_dir=args.download_dir,
            network=Network(retries=args.retries, backoff=args.backoff, timeout=args.timeout))
    reason = spice_unavailable_reason(dest)
    if reason is not None:
        log.warning("the jars are installed, but SPICE still cannot run here: %s", reason)
    elif args.dest and spice_unavailable_reason() is not None:
        log.info("SPICE finds the jars in %s when params spice.corenlp_dir or $%s names that folder", dest, CORENLP_ENV)
    else:
        log.info("SPICE can run now (jars in %s)", dest)
