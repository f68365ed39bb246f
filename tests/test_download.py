"""caprl download against a real HTTP server on 127.0.0.1: Range resume after a dropped
connection, checksum failures, a bounded pool, the failures manifest, and the CLI on TGIF."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from caprl.data.download import download
from caprl.data.fetch import CHECKSUMS, FAILURES, DownloadError, Job, fetch, fetch_all
from caprl.errors import CaprlError

FAST = {"retries": 3, "backoff": 0.001, "timeout": 10.0}


@dataclass
class Served:
    """What the server serves and what it saw; ``drop_once``, ``corrupt_once`` and ``no_range`` name paths."""

    files: dict[str, bytes] = field(default_factory=dict)
    drop_once: set[str] = field(default_factory=set)  # first request: half the body, then the connection closes
    corrupt_once: set[str] = field(default_factory=set)  # first full response: one byte flipped
    no_range: set[str] = field(default_factory=set)  # Range headers ignored (HTTP 200, whole body)
    delay: float = 0.0
    log: list[dict] = field(default_factory=list)  # {path, status, range, start, sent}
    active: int = 0
    max_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, path: str) -> list[dict]:
        return [r for r in self.log if r["path"] == path]


class Handler(BaseHTTPRequestHandler):
    served: Served

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        s = self.served
        with s.lock:
            s.active += 1
            s.max_active = max(s.max_active, s.active)
            first = not s.sent(self.path)
        try:
            time.sleep(s.delay)
            self._answer(s, first)
        finally:
            with s.lock:
                s.active -= 1

    def _answer(self, s: Served, first: bool) -> None:
        body, rng = s.files.get(self.path), self.headers.get("Range")
        start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng and self.path not in s.no_range else 0
        if body is None or start >= len(body) > 0:
            status, chunk = (404 if body is None else 416), b""
        else:
            status, chunk = (206 if start else 200), body[start:]
            if first and self.path in s.corrupt_once:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
        length = len(chunk)
        if first and self.path in s.drop_once:
            chunk = chunk[: length // 2]  # half the body, then the connection goes
            self.close_connection = True
        with s.lock:  # logged before answering: the client may look at the log before this thread goes on
            s.log.append({"path": self.path, "status": status, "range": rng, "start": start, "sent": len(chunk)})
        if status == 404:
            self.send_error(404)
            return
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        if status != 200:
            self.send_header("Content-Range", f"bytes */{len(body)}" if status == 416
                             else f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        self.wfile.write(chunk)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    served = Served()
    handler = type("BoundHandler", (Handler,), {"served": served})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def blob(n: int, seed: int = 0) -> bytes:
    return hashlib.shake_256(f"{seed}".encode()).digest(n)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_resume_after_a_dropped_connection_fetches_each_byte_once(tmp_path: Path, server) -> None:
    base, served = server
    served.files["/big.zip"] = data = blob(300_001)
    served.drop_once.add("/big.zip")
    dest = tmp_path / "big.zip"
    assert fetch(f"{base}/big.zip", dest, sha256=sha256(data), **FAST) == sha256(data)
    assert dest.read_bytes() == data
    first, second = served.sent("/big.zip")
    assert first["range"] is None and first["sent"] == len(data) // 2
    assert second["range"] == f"bytes={len(data) // 2}-" and second["status"] == 206
    assert sum(r["sent"] for r in served.log) == len(data)  # no byte served twice
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.zip"]  # no .part left
    assert fetch(f"{base}/big.zip", dest, **FAST) is None and len(served.log) == 2  # already there: no request


def test_a_whole_part_file_is_not_fetched_again(tmp_path: Path, server) -> None:
    base, served = server
    served.files["/val2014.zip"] = data = blob(10_000, seed=4)
    (tmp_path / "val2014.zip.part").write_bytes(data)  # stopped between the last byte and the rename
    assert fetch(f"{base}/val2014.zip", tmp_path / "val2014.zip", sha256=sha256(data), **FAST) == sha256(data)
    assert [(r["status"], r["sent"]) for r in served.log] == [(416, 0)]
    assert (tmp_path / "val2014.zip").read_bytes() == data and not (tmp_path / "val2014.zip.part").exists()


def test_a_server_ignoring_range_restarts_cleanly(tmp_path: Path, server) -> None:
    base, served = server
    served.files["/tgif-v1.0.tsv"] = data = blob(50_000, seed=1)
    served.drop_once.add("/tgif-v1.0.tsv")
    served.no_range.add("/tgif-v1.0.tsv")
    dest = tmp_path / "tgif-v1.0.tsv"
    fetch(f"{base}/tgif-v1.0.tsv", dest, sha256=sha256(data), **FAST)
    assert dest.read_bytes() == data  # the half already there was replaced, not appended to
    assert [r["status"] for r in served.log] == [200, 200] and served.log[1]["range"] == f"bytes={len(data) // 2}-"


def test_checksum_failure_names_the_file_and_both_checksums(tmp_path: Path, server) -> None:
    base, served = server
    served.files["/val2014.zip"] = data = blob(20_000, seed=2)
    wrong = "0" * 64
    dest = tmp_path / "val2014.zip"
    with pytest.raises(DownloadError) as exc:
        fetch(f"{base}/val2014.zip", dest, sha256=wrong, **FAST)
    message = str(exc.value)
    assert f"{dest}: sha256 mismatch: expected {wrong}, got {sha256(data)}" in message
    assert len(served.sent("/val2014.zip")) == 2  # re-downloaded once, then given up
    assert not dest.exists() and not list(tmp_path.iterdir())  # the bad bytes are deleted


def test_corrupt_once_succeeds_on_the_retry(tmp_path: Path, server, caplog: pytest.LogCaptureFixture) -> None:
    base, served = server
    served.files["/annotations.zip"] = data = blob(20_000, seed=3)
    served.corrupt_once.add("/annotations.zip")
    dest = tmp_path / "annotations.zip"
    fetch(f"{base}/annotations.zip", dest, md5=hashlib.md5(data).hexdigest(), **FAST)
    assert dest.read_bytes() == data and len(served.sent("/annotations.zip")) == 2
    assert f"{dest}: md5 mismatch" in caplog.text and "downloading it again" in caplog.text


def test_pool_is_bounded_and_failures_are_listed(tmp_path: Path, server) -> None:
    base, served = server
    served.delay = 0.05
    for k in range(12):
        served.files[f"/gifs/{k}.gif"] = blob(3000 + k, seed=k)
    jobs = [Job(f"{base}/gifs/{k}.gif", tmp_path / f"{k}.gif") for k in range(13)]  # 12.gif: 404
    fetched, failed = fetch_all(jobs, workers=3, **FAST)
    assert 2 <= served.max_active <= 3  # parallel, never more than --workers connections
    assert len(fetched) == 12 and all((tmp_path / f"{k}.gif").read_bytes() == served.files[f"/gifs/{k}.gif"]
                                      for k in range(12))
    assert failed == [{"url": f"{base}/gifs/12.gif", "dest": str(tmp_path / "12.gif"),
                       "error": f"{base}/gifs/12.gif -> {tmp_path / '12.gif'}: HTTP 404 Not Found"}]
    assert len(served.sent("/gifs/12.gif")) == 1  # a 404 is not retried
    assert not list(tmp_path.glob("*.part"))


def test_unpublished_checksum_is_recorded_then_enforced(tmp_path: Path, server) -> None:
    base, served = server
    archive = tmp_path / "src.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("dataset_coco.json", json.dumps({"images": []}))
        zf.writestr("dataset_flickr30k.json", json.dumps({"images": []}))
    path = "/people/karpathy/deepimagesent/caption_datasets.zip"
    served.files[path] = archive.read_bytes()
    out = tmp_path / "coco"
    download("karpathy", out, base_url=base, **FAST)
    assert (out / "dataset_coco.json").is_file() and (out / "dataset_flickr30k.json").is_file()
    recorded = json.loads((out / CHECKSUMS).read_text())["caption_datasets.zip"]
    assert recorded["sha256"] == sha256(served.files[path]) and recorded["url"].startswith("https://cs.stanford.edu")
    assert json.loads((out / FAILURES).read_text())["failed"] == []
    (out / "caption_datasets.zip").write_bytes(b"tampered")
    download("karpathy", out, base_url=base, **FAST)  # already there: not checked
    assert (out / "caption_datasets.zip").read_bytes() == b"tampered"
    download("karpathy", out, base_url=base, verify=True, **FAST)  # re-hashed, found wrong, fetched again
    assert (out / "caption_datasets.zip").read_bytes() == served.files[path]
    (out / "caption_datasets.zip").unlink()
    served.files[path] = served.files[path][:-1] + b"!"  # the file changed upstream
    with pytest.raises(CaprlError, match="1 of 1 downloads failed, e.g. .*caption_datasets.zip: sha256 mismatch"):
        download("karpathy", out, base_url=base, **FAST)
    assert json.loads((out / FAILURES).read_text())["failed"][0]["url"] == f"{base}{path}"


def test_flickr30k_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(CaprlError, match="request form at https://shannon.cs.illinois.edu/DenotationGraph/") as exc:
        download("flickr30k", tmp_path / "flickr30k")
    assert f"{tmp_path / 'flickr30k' / 'flickr30k-images'}/" in str(exc.value)


TGIF_HOST = "https://38.media.tumblr.com"
SENTENCES = ["a cat jumps onto a table .", "a man in a suit is dancing .", "two dogs play with a ball in the snow ."]


def tgif_files(served: Served, n_gifs: int) -> list[str]:
    """tgif-v1.0.tsv (``<GIF URL>\\t<sentence>``, a GIF on several lines), its split lists and the GIFs."""
    urls = [f"{TGIF_HOST}/{hashlib.md5(str(k).encode()).hexdigest()}/tumblr_n{k:04d}xqo1_{250 + 50 * (k % 4)}.gif"
            for k in range(n_gifs)]
    lines = [f"{u}\t{SENTENCES[k % 3]}" for k, u in enumerate(urls)] + [f"{urls[0]}\t{SENTENCES[1]}"]
    data = "/raingo/TGIF-Release/master/data/"
    served.files[data + "tgif-v1.0.tsv"] = ("\n".join(lines) + "\n").encode()
    for split, part in (("train", urls[:-2]), ("val", urls[-2:-1]), ("test", urls[-1:])):
        served.files[f"{data}splits/{split}.txt"] = ("\n".join(part) + "\n").encode()
    for k, u in enumerate(urls[1:], start=1):  # the first GIF is gone (404), as many TGIF GIFs are
        served.files[u.removeprefix(TGIF_HOST)] = b"GIF89a" + blob(2000 + 37 * k, seed=k)
    return urls


def caprl_download(out: Path, base: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([sys.executable, "-m", "caprl", "download", "--dataset", "tgif", "--out", str(out),
                           "--base-url", base, "--workers", "4", "--backoff", "0.001", *extra],
                          capture_output=True, text=True, timeout=60, env=env)


def test_cli_downloads_tgif(tmp_path: Path, server) -> None:
    base, served = server
    urls = tgif_files(served, 10)
    served.drop_once.add(urls[3].removeprefix(TGIF_HOST))
    out = tmp_path / "tgif"
    run = caprl_download(out, base)
    assert run.returncode == 2, run.stderr
    assert "1 of 10 downloads failed" in run.stderr and str(out / FAILURES) in run.stderr
    manifest = json.loads((out / FAILURES).read_text())
    assert manifest["n_jobs"] == 10 and [f["url"] for f in manifest["failed"]] == [base + urls[0][len(TGIF_HOST):]]
    assert manifest["failed"][0]["dest"] == str(out / "gifs" / urls[0].rsplit("/", 1)[1])
    assert "HTTP 404" in manifest["failed"][0]["error"]
    for u in urls[1:]:
        assert (out / "gifs" / u.rsplit("/", 1)[1]).read_bytes() == served.files[u.removeprefix(TGIF_HOST)]
    assert (out / "splits" / "train.txt").is_file() and (out / "tgif-v1.0.tsv").is_file()
    assert not list(out.rglob("*.part"))
    assert len(json.loads((out / CHECKSUMS).read_text())) == 4 + 9  # the TSV, 3 split lists, 9 GIFs

    served.files[urls[0].removeprefix(TGIF_HOST)] = b"GIF89a back"  # the missing GIF reappears
    n_before = len(served.log)
    run = caprl_download(out, base)
    assert run.returncode == 0, run.stderr
    assert [r["path"] for r in served.log[n_before:]] == [urls[0].removeprefix(TGIF_HOST)]  # the rest skipped
    assert json.loads((out / FAILURES).read_text())["failed"] == []


def test_cli_limit_takes_the_first_gifs(tmp_path: Path, server) -> None:
    base, served = server
    urls = tgif_files(served, 6)
    run = caprl_download(tmp_path / "tgif", base, "--limit", "3", "--workers", "2")
    assert run.returncode == 2  # the first GIF 404s
    names = sorted(p.name for p in (tmp_path / "tgif" / "gifs").iterdir())
    assert names == sorted(u.rsplit("/", 1)[1] for u in urls[1:3])
