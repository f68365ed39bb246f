"""The shared METEOR server: same scores as pycocoevalcap's Meteor, lifetime, stale sockets, fallback.

Each METEOR JVM costs ~6 s of CPU to start, so the module starts two: one server (module
fixture) and one in-process Meteor (the OfficialScorer that falls back, whose pycocoevalcap
Meteor is also the direct reference). The lifetime and stale-socket tests use servers that
never start their JVM (it starts at the first scoring request).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from caprl.errors import CaprlError
from caprl.metrics import meteor_server as ms
from caprl.metrics.official import OfficialScorer

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="no java")

# Already-tokenised strings (what OfficialScorer.meteor receives), with a repeated key type mix.
GTS = {
    1: ["a dog runs on the grass", "the brown dog is running in a field"],
    2: ["a cat sits on a mat", "a cat is lying on a red mat"],
    3: ["two men ride bicycles down a street", "people riding bikes in the city"],
    4: ["a plate of food with broccoli", "a white plate with meat and vegetables"],
}
RES = {1: ["a dog running in the grass"], 2: ["a cat on a mat"], 3: ["a man riding a horse"], 4: ["food"]}
GTS2 = {f"k{i}": [f"a {w} on the table", f"the {w} is on a wooden table"] for i, w in enumerate("cup book phone".split())}
RES2 = {"k0": ["a cup on a table"], "k1": ["a book"], "k2": ["a red phone on the floor"]}


def short_socket(tag: str) -> str:
    """A socket path under /tmp (pytest's tmp_path can exceed the 107-byte socket path limit)."""
    return f"/tmp/caprl-mt-{os.getpid()}-{tag}.sock"


def wait_until(condition, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    path = short_socket("shared")
    proc = ms.start(path, idle_timeout_s=300, parent_pid=os.getpid())
    yield path
    assert ms.stop(path)
    ms.stop_process(proc)
    assert proc.returncode == 0
    assert not os.path.lexists(path) and not os.path.lexists(path + ".pid")


@pytest.fixture(scope="module")
def fallback() -> Iterator[tuple[OfficialScorer, tuple[float, list[float]], list[logging.LogRecord]]]:
    """An OfficialScorer whose $CAPRL_METEOR_SOCKET names no server: it scores GTS/RES in-process."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("caprl.metrics.official")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ms.SOCKET_ENV, short_socket("missing"))
        scorer = OfficialScorer()
        try:
            result = scorer.meteor(GTS, RES)
            yield scorer, result, records
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
            scorer.close()


def test_same_scores_as_pycocoevalcap_meteor(server: str, fallback) -> None:  # noqa: ANN001
    scorer, _, _ = fallback
    direct = scorer._meteor  # pycocoevalcap's own Meteor object (in-process JVM)
    assert type(direct).__module__ == "pycocoevalcap.meteor.meteor"
    client = ms.MeteorClient(server)
    for gts, res in ((GTS, RES), (GTS2, RES2)):
        assert client.compute_score(gts, res) == direct.compute_score(dict(gts), dict(res))  # identical, not close


def test_concurrent_clients(server: str, fallback) -> None:  # noqa: ANN001
    scorer, _, _ = fallback
    expected = [scorer._meteor.compute_score(GTS, RES), scorer._meteor.compute_score(GTS2, RES2)]
    results: dict[int, list[tuple[float, list[float]]]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        client = ms.MeteorClient(server)
        try:
            for _ in range(5):
                results[n].append(client.compute_score(*((GTS, RES), (GTS2, RES2))[n]))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results[0] == [expected[0]] * 5 and results[1] == [expected[1]] * 5


def test_official_scorer_uses_the_server(server: str, fallback, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    _, in_process, _ = fallback
    monkeypatch.setenv(ms.SOCKET_ENV, server)
    scorer = OfficialScorer()
    assert scorer.meteor(GTS, RES) == in_process
    assert scorer._meteor is None  # no JVM of its own
    scorer.close()


def test_missing_socket_falls_back_to_own_jvm(fallback) -> None:  # noqa: ANN001
    scorer, result, records = fallback
    assert scorer._meteor is not None
    assert result == scorer._meteor.compute_score(GTS, RES)
    assert len(result[1]) == len(GTS) and 0 < result[0] < 1
    assert [r.levelno for r in records if "METEOR server" in r.getMessage()] == [logging.INFO]
    scorer.meteor(GTS, RES)  # the dead socket is not tried (nor logged) again
    assert len([r for r in records if "METEOR server" in r.getMessage()]) == 1


def test_server_reports_bad_requests(server: str) -> None:
    client = ms.MeteorClient(server)
    with pytest.raises(ms.MeteorServerError, match="different keys"):
        client.request({"gts": {"0": ["a dog"]}, "res": {}})
    with pytest.raises(ValueError, match="exactly one caption"):
        client.compute_score({1: ["a dog"]}, {1: ["a", "b"]})
    assert client.compute_score({1: ["a dog"]}, {1: ["a dog"]}) == (1.0, [1.0])  # still serving


def test_client_without_server() -> None:
    with pytest.raises(ms.ServerUnavailable):
        ms.MeteorClient(short_socket("nothing")).compute_score(GTS, RES)
    with pytest.raises(CaprlError, match="longer than"):
        ms.MeteorClient("/tmp/" + "x" * 120 + ".sock")


def test_exits_when_idle() -> None:
    path = short_socket("idle")
    proc = ms.start(path, idle_timeout_s=2.0, parent_pid=os.getpid())
    assert ms.MeteorClient(path).ping() == proc.pid
    assert proc.wait(10) == 0
    assert not os.path.lexists(path) and not os.path.lexists(path + ".pid")


def test_exits_when_parent_dies() -> None:
    parent = subprocess.Popen(["sleep", "30"])
    path = short_socket("parent")
    proc = ms.start(path, idle_timeout_s=300, parent_pid=parent.pid)
    try:
        time.sleep(1.2)
        assert proc.poll() is None
        parent.kill()  # not reaped yet: a zombie counts as dead
        assert proc.wait(10) == 0
        assert not os.path.lexists(path)
    finally:
        parent.kill()
        parent.wait()
        ms.stop_process(proc)


def test_sigterm_and_stop_by_pid_file() -> None:
    path = short_socket("term")
    proc = ms.start(path, idle_timeout_s=300)
    proc.terminate()
    assert proc.wait(10) == 0
    assert not os.path.lexists(path) and not os.path.lexists(path + ".pid")
    assert not ms.stop(path)  # nothing there: no error


def test_stale_socket_files_do_not_block_start(tmp_path: Path) -> None:
    path = short_socket("stale")
    Path(path).write_text("not a socket")  # a regular file
    proc = ms.start(path, idle_timeout_s=300)
    try:
        assert ms.MeteorClient(path).ping() == proc.pid
        with pytest.raises(CaprlError, match="already answers"):  # a live server is never replaced
            ms.serve(path, idle_timeout_s=1)
        assert ms.MeteorClient(path).ping() == proc.pid
    finally:
        ms.stop(path)
        ms.stop_process(proc)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a socket file nobody listens on
    dead.bind(path)
    dead.close()
    assert os.path.lexists(path)
    proc = ms.start(path, idle_timeout_s=300)
    try:
        assert ms.MeteorClient(path).ping() == proc.pid
    finally:
        assert ms.stop(path)
        ms.stop_process(proc)
    assert not os.path.lexists(path)


def test_start_shared_exports_and_stop_shared_unsets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ms.SOCKET_ENV, raising=False)
    path = ms.start_shared(idle_timeout_s=60)
    try:
        assert path == ms.workflow_socket_path() and os.environ[ms.SOCKET_ENV] == path
        assert ms.MeteorClient(path).ping() > 0
    finally:
        ms.stop_shared()
    assert ms.SOCKET_ENV not in os.environ
    assert not os.path.lexists(path)


def test_pipelined_requests_give_pycocoevalcaps_numbers(fallback) -> None:  # noqa: ANN001
    """caprl sends every SCORE line before reading the answers (meteor_pipe): on 450 held-out COCO
    captions (~90 kB of requests, more than a pipe's 64 kB) the scores are compute_score's, exactly."""
    from conftest_rewards import held_out

    from caprl.metrics import meteor_pipe

    scorer, _, _ = fallback
    ids, cands, refs = held_out(450)
    gts = {k: [" ".join(r) for r in refs[i]] for k, i in enumerate(ids)}
    res = {k: [" ".join(c)] for k, c in enumerate(cands)}
    assert sum(len(" ".join(v)) for v in gts.values()) > 2**16
    expected = scorer._meteor.compute_score(gts, res)
    assert meteor_pipe.compute_score(scorer._meteor, gts, res) == expected
    assert not scorer._meteor.lock.locked()
