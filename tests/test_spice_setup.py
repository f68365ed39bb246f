"""caprl setup-spice against a real HTTP server on 127.0.0.1 serving a folder laid out like Maven
Central: install and verify, the strongest checksum, resume after a dropped connection, a server
ignoring Range, checksum mismatch, 404, an unreachable repository, a destination not writable, and
the CLI as a subprocess. In every fault the destination is left without a partial jar."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from caprl.errors import CaprlError
from caprl.metrics import official
from caprl.metrics.official import CORENLP_ENV, CORENLP_JARS
from caprl.metrics.spice_setup import (ARTIFACT_PATH, MAVEN_CENTRAL, PINNED, REPO_ENV, Network, install,
                                       install_dir, jar_urls, pins_of)

FAST = Network(retries=2, backoff=0.001, timeout=10.0)
JAR, MODELS = CORENLP_JARS


@dataclass
class Repo:
    """A Maven layout under ``root``; ``drop`` (path -> times) and ``no_range`` (paths) inject faults."""

    root: Path
    url: str = ""
    drop: dict[str, int] = field(default_factory=dict)  # the next N GETs: half the body, then the connection closes
    no_range: set[str] = field(default_factory=set)  # Range ignored: HTTP 200 with the whole body
    log: list[dict] = field(default_factory=list)  # {method, path, status, range, sent}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def path(self, name: str) -> str:
        return f"/maven2/{ARTIFACT_PATH}/{name}"

    def gets(self, name: str) -> list[dict]:
        return [r for r in self.log if r["method"] == "GET" and r["path"] == self.path(name)]


class Handler(BaseHTTPRequestHandler):
    repo: Repo

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        self._answer(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        repo, rng = self.repo, self.headers.get("Range")
        self.path = urlsplit(self.path).path  # a proxy's request names the whole URL
        file = repo.root / self.path.lstrip("/")
        if not file.is_file():
            repo.log.append({"method": self.command, "path": self.path, "status": 404, "range": rng, "sent": 0})
            self.send_error(404)
            return
        data = file.read_bytes()
        start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng and self.path not in repo.no_range else 0
        if start >= len(data) > 0:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        chunk, status = data[start:], (206 if start else 200)
        length = len(chunk)
        with repo.lock:
            if body and repo.drop.get(self.path, 0) > 0:
                repo.drop[self.path] -= 1
                chunk = chunk[: length // 2]  # half of it, then the connection goes
                self.close_connection = True
            repo.log.append({"method": self.command, "path": self.path, "status": status, "range": rng,
                             "sent": len(chunk) if body else 0})
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(chunk)

    def log_message(self, *args: object) -> None:
        pass


def fake_jar(path: Path, n_classes: int) -> bytes:
    """A small real jar (a zip with a manifest and some stand-in class files)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for k in range(n_classes):
            zf.writestr(f"edu/stanford/nlp/C{k}.class", hashlib.sha256(f"{path.name}{k}".encode()).digest() * 40)
    return path.read_bytes()


def publish(folder: Path, name: str, data: bytes, algos: tuple[str, ...] = ("sha1", "md5")) -> None:
    """Write ``name`` and its checksum files as Maven Central does (.sha1 as ``<hex>  <name>``)."""
    (folder / name).write_bytes(data)
    for algo in algos:
        digest = hashlib.new(algo, data).hexdigest()
        (folder / f"{name}.{algo}").write_text(f"{digest}  {name}\n" if algo == "sha1" else digest)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", REPO_ENV,
                 CORENLP_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def maven(tmp_path: Path) -> Iterator[Repo]:
    """Both jars published under ``<root>/maven2`` with .sha1 and .md5, as Maven Central has 3.6.0's."""
    repo = Repo(tmp_path / "served")
    folder = repo.root / "maven2" / ARTIFACT_PATH
    folder.mkdir(parents=True)
    for name, n in ((JAR, 40), (MODELS, 90)):
        publish(folder, name, fake_jar(tmp_path / name, n))
        (tmp_path / name).unlink()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Bound", (Handler,), {"repo": repo}))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    repo.url = f"http://127.0.0.1:{httpd.server_address[1]}/maven2"
    yield repo
    httpd.shutdown()
    httpd.server_close()


def served(repo: Repo, name: str) -> bytes:
    return (repo.root / "maven2" / ARTIFACT_PATH / name).read_bytes()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_installs_both_jars_verified_where_spice_finds_them(tmp_path: Path, maven: Repo) -> None:
    dest, cache = tmp_path / "corenlp", tmp_path / "cache"
    assert install(dest, maven.url, cache, FAST) == [dest / JAR, dest / MODELS]
    assert listing(dest) == sorted(CORENLP_JARS)
    assert all((dest / name).read_bytes() == served(maven, name) for name in CORENLP_JARS)
    assert not cache.exists()  # the downloads were moved in; the empty download folder removed
    requested = [r["path"].rsplit("/", 1)[1] for r in maven.log]
    assert f"{JAR}.sha1" in requested and f"{JAR}.md5" not in requested  # sha1 beats md5; sha512, sha256: 404
    if shutil.which("java") is not None:
        assert official.spice_classpath(dest)[-2:] == [dest / JAR, dest / MODELS]
    before = len(maven.log)
    install(dest, maven.url, cache, FAST)  # again: both already there and matching, no jar downloaded
    assert not any(r["method"] == "GET" and r["path"].endswith(".jar") for r in maven.log[before:])


def test_the_strongest_published_checksum_is_the_one_used(tmp_path: Path, maven: Repo) -> None:
    folder = maven.root / "maven2" / ARTIFACT_PATH
    publish(folder, JAR, served(maven, JAR), algos=("sha512", "sha256"))
    (folder / f"{JAR}.sha1").write_text("0" * 40)  # wrong ones, never read when a sha512 is there
    (folder / f"{JAR}.md5").write_text("0" * 32)
    install(tmp_path / "dest", maven.url, tmp_path / "cache", FAST)
    assert (tmp_path / "dest" / JAR).read_bytes() == served(maven, JAR)
    asked = [r["path"].rsplit(".", 1)[1] for r in maven.log if r["path"].startswith(maven.path(JAR) + ".")]
    assert asked == ["sha512"]


def test_checksum_mismatch_names_file_and_digests_and_leaves_nothing(tmp_path: Path, maven: Repo) -> None:
    wrong = "f" * 40
    (maven.root / "maven2" / ARTIFACT_PATH / f"{MODELS}.sha1").write_text(wrong)
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    with pytest.raises(CaprlError) as exc:
        install(dest, maven.url, cache, FAST)
    good = hashlib.sha1(served(maven, MODELS)).hexdigest()
    assert f"{cache / MODELS}: sha1 mismatch: {maven.url}/{ARTIFACT_PATH}/{MODELS}.sha1 says {wrong}" in str(exc.value)
    assert f"hashes to {good}; the bad file was deleted" in str(exc.value)
    assert listing(dest) == []  # the verified plain jar waits in the download folder, not half an install
    assert listing(cache) == [JAR]


def test_dropped_connection_resumes_with_range(tmp_path: Path, maven: Repo) -> None:
    maven.drop[maven.path(MODELS)] = 1
    dest = tmp_path / "dest"
    install(dest, maven.url, tmp_path / "cache", FAST)
    data = served(maven, MODELS)
    first, second = maven.gets(MODELS)
    assert first["range"] is None and first["sent"] == len(data) // 2
    assert second["range"] == f"bytes={len(data) // 2}-" and second["status"] == 206
    assert first["sent"] + second["sent"] == len(data)  # no byte sent twice
    assert (dest / MODELS).read_bytes() == data


def test_a_broken_download_is_kept_aside_and_resumed_by_the_next_run(tmp_path: Path, maven: Repo) -> None:
    maven.drop[maven.path(MODELS)] = FAST.retries + 1  # every try of this run breaks off
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    with pytest.raises(CaprlError) as exc:
        install(dest, maven.url, cache, FAST)
    message = str(exc.value)
    assert f"gave up after {FAST.retries + 1} attempts" in message and "run `caprl setup-spice` again" in message
    assert f"kept in {cache / (MODELS + '.part')}" in message
    assert listing(dest) == []
    have = (cache / f"{MODELS}.part").stat().st_size
    assert have == sum(r["sent"] for r in maven.gets(MODELS)) < len(served(maven, MODELS))  # each try resumed
    install(dest, maven.url, cache, FAST)  # the connection holds now
    assert maven.gets(MODELS)[-1]["range"] == f"bytes={have}-"
    assert (dest / MODELS).read_bytes() == served(maven, MODELS)


def test_a_server_ignoring_range_restarts_cleanly(tmp_path: Path, maven: Repo) -> None:
    maven.drop[maven.path(JAR)] = 1
    maven.no_range.add(maven.path(JAR))
    install(tmp_path / "dest", maven.url, tmp_path / "cache", FAST)
    assert [r["status"] for r in maven.gets(JAR)] == [200, 200] and maven.gets(JAR)[1]["range"]
    assert (tmp_path / "dest" / JAR).read_bytes() == served(maven, JAR)  # the half was replaced, not appended to


def test_404_names_the_url_and_the_missing_artifact(tmp_path: Path, maven: Repo) -> None:
    (maven.root / "maven2" / ARTIFACT_PATH / MODELS).unlink()  # a mirror with the plain jar only
    dest = tmp_path / "dest"
    with pytest.raises(CaprlError) as exc:
        install(dest, maven.url, tmp_path / "cache", FAST)
    assert f"{maven.url}/{ARTIFACT_PATH}/{MODELS}: HTTP 404 Not Found" in str(exc.value)
    assert "may lack the artifact edu.stanford.nlp:stanford-corenlp:3.6.0" in str(exc.value)
    assert listing(dest) == []


def test_unreachable_repository_says_what_to_copy_where(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    repo, dest = f"http://127.0.0.1:{port}/maven2", tmp_path / "dest"
    with pytest.raises(CaprlError) as exc:
        install(dest, repo, tmp_path / "cache", Network(retries=0, timeout=5.0))
    message = str(exc.value)
    assert message.startswith(f"could not reach {repo}/{ARTIFACT_PATH}/{JAR} (")
    for url in (*jar_urls(repo).values(), *jar_urls(MAVEN_CENTRAL).values()):
        assert url in message
    assert f"copy both into {dest}" in message and f"${CORENLP_ENV}" in message and "HTTPS_PROXY" in message
    assert listing(dest) == []


def test_a_destination_that_cannot_be_written_fails_before_any_download(tmp_path: Path, maven: Repo) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    dest = tmp_path / "a-file" / "corenlp"
    with pytest.raises(CaprlError, match=f"could not write the CoreNLP jars' folder {re.escape(str(dest))} .*--dest"):
        install(dest, maven.url, tmp_path / "cache", FAST)
    with pytest.raises(CaprlError, match="is the destination: its partial downloads would lie where SPICE looks"):
        install(tmp_path / "corenlp", maven.url, tmp_path / "corenlp", FAST)
    assert maven.log == [] and not (tmp_path / "corenlp").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write in any folder")
def test_a_read_only_destination_is_a_write_error(tmp_path: Path, maven: Repo) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    dest.chmod(0o555)
    try:
        with pytest.raises(CaprlError, match="you may not write in"):
            install(dest, maven.url, tmp_path / "cache", FAST)
    finally:
        dest.chmod(0o755)
    assert listing(dest) == [] and maven.log == []


def test_install_dir_follows_the_folders_spice_looks_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = official._package_dir("pycocoevalcap.spice.spice") / "lib"
    assert install_dir() == lib
    monkeypatch.setenv(CORENLP_ENV, str(tmp_path / "env"))
    assert install_dir() == tmp_path / "env"
    assert install_dir(corenlp_dir=str(tmp_path / "params")) == tmp_path / "params"
    assert install_dir(tmp_path / "cli", str(tmp_path / "params")) == tmp_path / "cli"


# `caprl setup-spice` in a child process whose pinned table holds the test server's jars (argv[1], JSON)
PINNED_CLI = ("import json, sys; from caprl.metrics import spice_setup; spice_setup.PINNED.clear(); "
              "spice_setup.PINNED.update(json.loads(sys.argv.pop(1))); from caprl.cli import entry; sys.exit(entry())")


def pinned_to(repo: Repo) -> dict[str, dict[str, str]]:
    """The served jars' SHA-256s, as :data:`PINNED` holds Maven Central's."""
    return {name: {"sha256": hashlib.sha256(served(repo, name)).hexdigest()} for name in CORENLP_JARS}


def run_cli(*args: str, env: dict[str, str] | None = None,
            pinned: dict[str, dict[str, str]] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    return subprocess.run([sys.executable, "-c", PINNED_CLI, json.dumps(pinned or {}), "setup-spice", *args],
                          capture_output=True, text=True, env={**environ, **(env or {})}, timeout=120)


def test_cli_installs_and_reports_faults(tmp_path: Path, maven: Repo) -> None:
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    out = run_cli("--repo", maven.url, "--dest", str(dest), "--download-dir", str(cache), "--backoff", "0",
                  pinned=pinned_to(maven))
    assert out.returncode == 0, out.stderr
    assert all((dest / name).read_bytes() == served(maven, name) for name in CORENLP_JARS)
    (maven.root / "maven2" / ARTIFACT_PATH / JAR).unlink()
    other = tmp_path / "other"  # the repository from $CAPRL_MAVEN_REPO
    out = run_cli("--dest", str(other), "--download-dir", str(cache), "--retries", "0", env={REPO_ENV: maven.url})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"caprl setup-spice: error: {maven.url}/{ARTIFACT_PATH}/{JAR}: HTTP 404" in out.stderr
    assert listing(other) == []


def test_cli_goes_through_the_proxy_that_http_proxy_names(tmp_path: Path, maven: Repo) -> None:
    """The repository's host does not resolve: only the proxy (our server) can answer for it."""
    dest, host = tmp_path / "dest", maven.url.split("/")[2]
    out = run_cli("--repo", "http://maven.caprl.invalid/maven2", "--dest", str(dest), "--download-dir",
                  str(tmp_path / "cache"), "--retries", "0", env={"HTTP_PROXY": f"http://{host}", "NO_PROXY": "",
                                                                  "no_proxy": ""}, pinned=pinned_to(maven))
    assert out.returncode == 0, out.stderr
    assert all((dest / name).read_bytes() == served(maven, name) for name in CORENLP_JARS)


# ---------------------------------------------------------------- digests pinned in the code


def test_a_jar_whose_pinned_digest_differs_is_refused_and_nothing_is_installed(tmp_path: Path, maven: Repo) -> None:
    """A mirror serving another models jar with a matching .sha1 beside it: the published checksum passes,
    the pinned SHA-256 does not; the download is deleted and the destination stays empty."""
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    pinned = pinned_to(maven)
    genuine = pinned[MODELS]["sha256"]
    forged = fake_jar(tmp_path / "forged.jar", 91)
    publish(maven.root / "maven2" / ARTIFACT_PATH, MODELS, forged)  # its own .sha1 and .md5: they match
    with pytest.raises(CaprlError) as exc:
        install(dest, maven.url, cache, FAST, pinned=pinned)
    message = str(exc.value)
    assert (f"{cache / MODELS}: sha256 mismatch against the digest caprl pins for {MODELS}: pinned {genuine}, "
            f"the downloaded file hashes to {hashlib.sha256(forged).hexdigest()}") in message
    assert "another file than Maven Central's edu.stanford.nlp:stanford-corenlp:3.6.0" in message
    assert "nothing installed" in message
    assert listing(dest) == []
    assert listing(cache) == [JAR]  # the plain jar, verified both ways, waits; no models jar, no .part


def test_pinned_digests_accept_the_genuine_jars_and_are_checked_on_an_installed_one(tmp_path: Path,
                                                                                    maven: Repo) -> None:
    dest, cache = tmp_path / "dest", tmp_path / "cache"
    assert install(dest, maven.url, cache, FAST, pinned=pinned_to(maven)) == [dest / JAR, dest / MODELS]
    before = len(maven.log)
    install(dest, maven.url, cache, FAST, pinned=pinned_to(maven))  # both match, both pins: nothing downloaded
    assert not any(r["method"] == "GET" and r["path"].endswith(".jar") for r in maven.log[before:])
    wrong = {**pinned_to(maven), JAR: {"sha1": "0" * 40}}  # the installed jar matches its .sha1, not the pin
    with pytest.raises(CaprlError, match=f"sha1 mismatch against the digest caprl pins for {JAR}"):
        install(dest, maven.url, cache, FAST, pinned=wrong)
    assert any(r["method"] == "GET" and r["path"] == maven.path(JAR) for r in maven.log[before:])
    assert (dest / JAR).read_bytes() == served(maven, JAR)  # what was installed stays: nothing replaced it


def test_the_real_install_checks_the_table_in_the_code_and_its_entries_are_digests() -> None:
    assert inspect.signature(install).parameters["pinned"].default is PINNED
    assert set(PINNED) <= set(CORENLP_JARS)
    for name in PINNED:
        assert pins_of(name, PINNED)  # well formed: an algorithm Maven publishes, its number of hex digits
    with pytest.raises(CaprlError, match="not a sha512/sha256/sha1/md5 hex digest"):
        pins_of(JAR, {JAR: {"sha256": "abc"}})
