"""OfficialScorer: the pycocoevalcap numbers, one METEOR JVM, SPICE reported as unavailable."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest_rewards import REPO, coco_raw, official_scorer
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from caprl.errors import CaprlError
from caprl.metrics.official import METRICS, _package_dir, spice_unavailable_reason

N_IMAGES = 100


@pytest.fixture(scope="module")
def sample():
    raw = coco_raw()
    ids = list(raw)[:N_IMAGES]
    refs = {i: raw[i][1:] for i in ids}
    results = {i: raw[i][0] if k % 7 else raw[ids[k - 1]][0] for k, i in enumerate(ids)}  # some wrong captions
    return refs, results


def test_scores_equal_direct_pycocoevalcap(sample):
    refs, results = sample
    out = official_scorer().score(refs, results, metrics=list(METRICS), per_image=True)
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": c} for c in refs[i]] for i in results})
    res = tok.tokenize({i: [{"caption": results[i]}] for i in results})
    bleu, bleu_per = Bleu(4).compute_score(gts, res, verbose=0)
    rouge, _ = Rouge().compute_score(gts, res)
    cider, cider_per = Cider().compute_score(gts, res)
    meteor, _ = official_scorer().meteor(gts, res)  # pycocoevalcap's Meteor, on the direct tokenisation
    expected = {f"BLEU-{n + 1}": bleu[n] for n in range(4)}
    expected.update({"METEOR": meteor, "ROUGE-L": rouge, "CIDEr-D": cider})
    assert out["corpus"].keys() == expected.keys()
    for name, value in expected.items():
        assert math.isclose(out["corpus"][name], value, abs_tol=1e-12), name
    first = next(iter(results))
    assert out["per_image"][first]["BLEU-4"] == pytest.approx(bleu_per[3][0], abs=1e-12)
    np.testing.assert_allclose([out["per_image"][i]["CIDEr-D"] for i in results], cider_per, atol=1e-12)
    if spice_unavailable_reason() is not None:
        assert "SPICE" not in out["corpus"] and "SPICE" not in out["per_image"][first]
        assert "CoreNLP" in out["unavailable"]["SPICE"]


def test_meteor_jvm_started_once(sample):
    refs, results = sample
    scorer = official_scorer()
    scorer.score(refs, results, metrics=["meteor"])
    process = scorer._meteor.meteor_p
    out = scorer.score(refs, dict(list(results.items())[:10]), metrics=["meteor", "bleu"])
    assert scorer._meteor.meteor_p is process and process.poll() is None
    assert set(out["corpus"]) == {"METEOR", "BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"} and not out["unavailable"]


def test_spice_detection_downloads_nothing():
    lib = _package_dir("pycocoevalcap.spice.spice") / "lib"
    before = sorted(os.listdir(lib)) if lib.exists() else []
    reason = spice_unavailable_reason()
    assert (sorted(os.listdir(lib)) if lib.exists() else []) == before
    if reason is not None:
        assert "stanford-corenlp-3.6.0" in reason
        out = official_scorer().score({1: ["a dog runs"]}, {1: "a dog"}, metrics=["spice"])
        assert out == {"corpus": {}, "unavailable": {"SPICE": reason}}


def test_input_errors():
    scorer = official_scorer()
    with pytest.raises(CaprlError, match="no references: 7"):
        scorer.score({1: ["a dog"]}, {7: "a cat"}, metrics=["bleu"])
    with pytest.raises(CaprlError, match="unknown metric"):
        scorer.score({1: ["a dog"]}, {1: "a cat"}, metrics=["cider"])


def test_meteor_process_is_stopped_at_interpreter_exit():
    # the check is registered before caprl's own exit hook, so it runs after it (LIFO)
    script = textwrap.dedent(
        """
        import atexit
        state = {}
        atexit.register(lambda: print("alive" if state["proc"].poll() is None else "stopped", flush=True))
        from caprl.metrics.official import OfficialScorer
        scorer = OfficialScorer()
        scorer.meteor({1: ["a dog runs"]}, {1: ["a dog"]})
        state["proc"] = scorer._meteor.meteor_p
        print(state["proc"].pid, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid, verdict = done.stdout.split()[-2:]
    assert verdict == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


def test_a_dead_meteor_jvm_is_an_error_then_restarted():
    scorer = official_scorer()
    gts, res = {1: ["a dog runs on the grass"]}, {1: ["a dog runs"]}
    first, _ = scorer.meteor(gts, res)
    process = scorer._meteor.meteor_p
    process.kill()
    process.wait()
    with pytest.raises(CaprlError, match="METEOR's Java process failed"):
        scorer.meteor(gts, res)
    assert scorer.meteor(gts, res)[0] == first and scorer._meteor.meteor_p is not process
