"""caprl's SPICE server: the Java source against SPICE's jar, real JVM failures, and the protocol.

Without the Stanford CoreNLP 3.6.0 jars SPICE cannot score here, so: the Java launcher is
compiled against pycocoevalcap's spice-1.0.jar, the real JVM is started without CoreNLP
(it must fail with the reason, after one restart), and the line protocol, restart and
close logic are checked against FAKE_SERVER, a stand-in script that is not SPICE.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from caprl.errors import CaprlError
from caprl.metrics.official import CORENLP_JARS, OfficialScorer, _package_dir, run_spice
from caprl.rewards import build_configured_reward
from caprl.metrics.spice_server import SOURCE, SpiceFailed, SpiceServer, java_command

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no java")
ITEMS = [("a dog runs", ["a dog is running", "the dog runs"]), ("a cat", ["a cat on a mat"])]

# A stand-in for SpiceServer.java speaking the same protocol (NOT SPICE: f = words / 10).
# argv[1] = "die-once" (exit at the first request of the first process, a marker file
# counts processes), "error" (answer every request with an error) or "ok".
FAKE_SERVER = textwrap.dedent(
    """
    import json, os, sys
    mode, marker = sys.argv[1], sys.argv[2]
    first = not os.path.exists(marker)
    open(marker, "a").write("started\\n")
    print("ready", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if line == "quit":
            break
        if mode == "die-once" and first:
            sys.exit(3)
        if mode == "error":
            print("error java.lang.RuntimeException: bad caption", flush=True)
            continue
        src, dst = line.split("\\t")
        items = json.load(open(src))
        out = [{"image_id": it["image_id"],
                "scores": {"All": {"f": len(it["test"].split()) / 10, "pr": "NaN", "re": None}}}
               for it in reversed(items)]
        json.dump(out, open(dst, "w"))
        print("ok %d" % len(items), flush=True)
    """
)


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_spice_server.py"
    script.write_text(FAKE_SERVER)
    marker = tmp_path / "starts.txt"
    return lambda mode: [sys.executable, str(script), mode, str(marker)]


@pytest.fixture
def stand_in_corenlp(tmp_path, monkeypatch):
    """A folder of jars named like CoreNLP's but holding no classes: detection passes, SPICE cannot load."""
    folder = tmp_path / "corenlp"
    folder.mkdir()
    for name in CORENLP_JARS:
        with zipfile.ZipFile(folder / name, "w") as jar:
            jar.writestr("README", "stand-in: not CoreNLP")
    monkeypatch.delenv("CAPRL_CORENLP_DIR", raising=False)
    return folder


@pytest.mark.skipif(shutil.which("javac") is None, reason="no javac")
def test_java_launcher_compiles_against_spice_jar(tmp_path):
    spice = _package_dir("pycocoevalcap.spice.spice")
    classpath = f"{spice / 'spice-1.0.jar'}:{spice / 'lib' / '*'}"
    done = subprocess.run(
        ["javac", "-Xlint:-path", "-d", str(tmp_path), "-cp", classpath, str(SOURCE)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "SpiceServer.class").exists() and (tmp_path / "SpiceServer$CachingParser.class").exists()


def test_protocol_scores_in_request_order(fake):
    with SpiceServer(fake("ok")) as server:
        assert server.f_scores(ITEMS) == [0.3, 0.2]
        scores = server.score(ITEMS)
        assert scores[0]["All"]["re"] != scores[0]["All"]["re"]  # None -> NaN, as pycocoevalcap
        assert server.f_scores([]) == [] and server.starts == 1
        process = server._proc
    assert process.poll() is not None and server._proc is None


def test_protocol_restarts_a_dead_process_once(fake):
    server = SpiceServer(fake("die-once"))
    assert server.f_scores(ITEMS) == [0.3, 0.2]
    assert server.starts == 2
    server.close()
    server.close()


def test_protocol_error_answer_is_raised_without_restart(fake):
    with SpiceServer(fake("error")) as server, pytest.raises(SpiceFailed, match="bad caption"):
        server.f_scores(ITEMS)
    assert server.starts == 1


def test_protocol_gives_up_after_one_restart(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys\nprint('no', flush=True)\n")
    with pytest.raises(SpiceFailed, match="failed twice.*instead of 'ready'"):
        SpiceServer([sys.executable, str(script)]).f_scores(ITEMS)


def test_run_spice_keeps_the_reference_order(fake, stand_in_corenlp):
    gts = {7: ["a cat on a mat"], 3: ["a dog is running"]}
    res = {3: ["a dog runs now"], 7: ["a cat"]}
    with SpiceServer(fake("ok")) as server:
        score, per = run_spice(gts, res, stand_in_corenlp, server)
    assert per == [0.2, 0.4] and score == pytest.approx(0.3)


@needs_java
def test_real_spice_without_corenlp_fails_with_the_reason(stand_in_corenlp):
    params = {"rewards": {"spider": {"kind": "mix", "weights": {"cider_d": 0.5, "spice": 0.5}}},
              "spice": {"corenlp_dir": str(stand_in_corenlp)}}
    refs = {1: [["a", "dog", "is", "running"]]}
    with build_configured_reward("spider", params, refs, None) as spider:
        spice = spider.components["spice"]
        assert str(SOURCE) in spice._server.command and spice._server.starts == 0  # started lazily
        with pytest.raises(CaprlError, match="failed twice.*could not start SPICE.*NoClassDefFoundError"):
            spider([1], [["a", "dog"]])
        assert spice._server.starts == 2


@needs_java
def test_evaluation_reports_spice_failure_as_unavailable(stand_in_corenlp):
    with OfficialScorer(corenlp_dir=stand_in_corenlp) as scorer:
        result = scorer.score({1: ["a dog runs"]}, {1: "a dog"}, metrics=["spice"])
    assert result["corpus"] == {} and "SPICE failed to run" in result["unavailable"]["SPICE"]


@needs_java
def test_java_command_shape(stand_in_corenlp):
    from caprl.metrics.official import spice_classpath

    command = java_command(spice_classpath(stand_in_corenlp), threads=2, subset=True, synsets=False)
    assert command[0] == "java" and command[1] == "-Xmx8G" and str(SOURCE) in command
    assert command[-5:] == [str(SOURCE), "-threads", "2", "-noSynsets", "-subset"]
