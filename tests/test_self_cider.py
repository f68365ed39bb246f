"""Self-CIDEr (Wang & Chan, CVPR 2019) as self-critical.pytorch's eval_multi computes it.

References: hand computations on tiny caption sets; SCP's formula re-derived here in numpy
(dense n-gram matrices, a different route from caprl's per-set dictionaries); and, where the
peers folder holds SCP's code, SCP's own ``CiderScorer.my_get_self_cider`` and ``get_div``.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest_rewards import REPO, coco_raw, coco_tokens

from caprl.errors import CaprlError
from caprl.evaluation.self_cider import cider_kernel, kernel_diversity, self_cider

SCP_TARBALL = REPO.parent / "shared" / "peers" / "self-critical.pytorch" / "scp_py.tgz"
SCP_SCORER = "cider/pyciderevalcap/cider/cider_scorer.py"


def test_two_captions_by_hand() -> None:
    """refs: 'a' is in every image's references (idf 0); every other n-gram in at most one
    (idf log 2 - log 1 = log 2). 'a b c d' vs 'a b c e': unigrams share b, c of 3 weighted -> 2/3;
    bigrams share (a b), (b c) of 3 -> 2/3; trigrams (a b c) of 2 -> 1/2; 4-grams none -> 0.
    K = [[1, s], [s, 1]], s = (2/3 + 2/3 + 1/2 + 0) / 4 = 11/24, eigenvalues 1 +- s."""
    refs = {1: [["a", "x"]], 2: [["a", "y"]]}
    caps = [["a", "b", "c", "d"], ["a", "b", "c", "e"]]
    df = {("a",): 2, ("x",): 1, ("y",): 1, ("a", "x"): 1, ("a", "y"): 1}
    s = 11 / 24
    np.testing.assert_allclose(cider_kernel(caps, df, 2), [[1, s], [s, 1]], atol=1e-12)
    expected = -math.log(math.sqrt(1 + s) / (math.sqrt(1 + s) + math.sqrt(1 - s))) / math.log(2)
    assert self_cider({7: caps}, refs) == pytest.approx(expected, abs=1e-12)
    assert 0 < expected < 1


def test_identical_captions_score_zero_and_captions_sharing_nothing_one() -> None:
    refs = {1: [["a", "dog", "on", "grass"]], 2: [["a", "cat", "on", "a", "bed"]], 3: [["two", "birds"]]}
    same = [["a", "dog", "runs", "on", "the", "grass"]] * 3
    apart = [["a", "dog", "runs", "fast"], ["two", "cats", "sleep", "inside"], ["one", "bird", "sings", "loudly"]]
    # 'a' is in 2 of 3 documents: a weighted word, yet 'apart' shares no n-gram with weight between captions
    got = self_cider({1: same, 2: apart, 3: apart[:2]}, refs)
    assert kernel_diversity(cider_kernel(same, {}, 3)) == pytest.approx(0.0, abs=1e-6)
    assert kernel_diversity(cider_kernel(apart, {}, 3)) == pytest.approx(1.0, abs=1e-12)  # K = I: the maximum
    assert got == pytest.approx((0.0 + 1.0 + 1.0) / 3, abs=1e-6)
    # a 3-word caption has no 4-gram: K = diag(1, 3/4), r = 1 / (1 + sqrt(3/4)) > 1/2, below the maximum
    short = kernel_diversity(cider_kernel([["x", "y", "z", "w"], ["p", "q", "r"]], {}, 3))
    assert short == pytest.approx(-math.log(1 / (1 + math.sqrt(0.75))) / math.log(2), abs=1e-12)
    assert 0 < short < 1


def test_empty_kernel_and_errors() -> None:
    assert kernel_diversity(np.zeros((5, 5))) == 0.0  # every caption empty: no weighted n-gram (SCP: NaN)
    assert self_cider({1: [[], []]}, {1: [["a"]], 2: [["b"]]}) == 0.0
    with pytest.raises(CaprlError, match="need at least 2"):
        kernel_diversity(np.ones((1, 1)))
    with pytest.raises(CaprlError, match="no images"):
        self_cider({}, {1: [["a"]]})


def scp_rederived(sets: dict[int, list[list[str]]], refs: dict[int, list[list[str]]]) -> dict[int, float]:
    """SCP's eval_self_cider in dense numpy: df = images whose references hold an n-gram,
    ref_len = log(images); per order the tf-idf matrix of the set, cosine where both norms are
    non-zero (else the dot product); K = 10 * mean over orders; get_div(eigvalsh(K / 10))."""
    def grams(words: list[str], n: int) -> list[tuple[str, ...]]:
        return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]

    ref_len = np.log(float(len(refs)))
    scores = {}
    for image in sets:
        caps = sets[image]
        per_order = []
        for n in range(1, 5):
            space = sorted({g for c in caps for g in grams(c, n)})
            tf = np.array([[grams(c, n).count(g) for g in space] for c in caps], dtype=float).reshape(len(caps), -1)
            in_doc = np.array([[any(g in grams(r, n) for r in rs) for g in space] for rs in refs.values()])
            df = in_doc.sum(axis=0) if space else np.zeros(0)
            vec = tf * (ref_len - np.log(np.maximum(1.0, df)))
            norm = np.sqrt((vec ** 2).sum(axis=1))
            dots = vec @ vec.T
            both = np.outer(norm != 0, norm != 0)
            per_order.append(np.where(both, dots / np.where(both, np.outer(norm, norm), 1.0), dots))
        eigvals = np.clip(np.linalg.eigvalsh(10.0 * np.mean(per_order, axis=0) / 10), 0, None)
        scores[image] = float(-np.log(np.sqrt(eigvals[-1]) / (np.sqrt(eigvals).sum())) / np.log(len(eigvals)))
    return scores


#: A rank-deficient kernel (repeated captions) has eigenvalues ~1e-16 whose square roots (~1e-8)
#: enter the sum: the two computations' rounding differs there, by far less than this.
TOLERANCE = 1e-8


def coco_sets() -> tuple[dict[int, list[list[str]]], dict[int, list[list[str]]]]:
    """Caption sets from COCO's human captions (diverse, partly repeated, one with a copy of another
    image's caption) and the references of 40 images as the df corpus."""
    tokens = coco_tokens()
    ids = list(tokens)[:40]
    sets = {i: tokens[i][:5] for i in ids[:6]}
    sets[ids[6]] = [tokens[ids[6]][0]] * 3 + tokens[ids[6]][1:3]
    sets[ids[7]] = tokens[ids[7]][:4] + [tokens[ids[0]][0]]
    return sets, {i: tokens[i] for i in ids}


def test_matches_scps_formula_rederived_in_numpy() -> None:
    sets, refs = coco_sets()
    expected = scp_rederived(sets, refs)
    human, repeated = list(expected.values())[:6], expected[list(sets)[6]]
    assert 0.5 < min(human) and repeated < 0.5  # human sets are diverse, one with a caption thrice is not
    assert self_cider(sets, refs) == pytest.approx(float(np.mean(list(expected.values()))), abs=TOLERANCE)
    for image, value in expected.items():
        assert self_cider({image: sets[image]}, refs) == pytest.approx(value, abs=TOLERANCE)


@pytest.mark.skipif(not SCP_TARBALL.exists(), reason="self-critical.pytorch's code is not in the peers folder")
def test_matches_scps_own_code(tmp_path: Path) -> None:
    """SCP's CiderScorer (from the peers folder's tarball) as eval_self_cider drives it: every
    image's references appended, compute_doc_freq, ref_len = log(images), my_get_self_cider of each
    set, then get_div on eigvalsh(K / 10)."""
    subprocess.run(["tar", "-xzf", str(SCP_TARBALL), "-C", str(tmp_path), SCP_SCORER], check=True)
    spec = importlib.util.spec_from_file_location("scp_cider_scorer", tmp_path / SCP_SCORER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scp_cider_scorer"] = module
    spec.loader.exec_module(module)
    sets, refs = coco_sets()
    scorer = module.CiderScorer(df_mode="corpus")
    for caps in refs.values():
        scorer += (None, [" ".join(c) for c in caps])
    scorer.compute_doc_freq()
    scorer.ref_len = np.log(float(len(scorer.crefs)))

    def get_div(eigvals: np.ndarray) -> float:  # eval_multi.get_div
        eigvals = np.clip(eigvals, 0, None)
        return -np.log(np.sqrt(eigvals[-1]) / (np.sqrt(eigvals).sum())) / np.log(len(eigvals))

    expected = {i: get_div(np.linalg.eigvalsh(scorer.my_get_self_cider([" ".join(c) for c in sets[i]]) / 10))
                for i in sets}
    assert self_cider(sets, refs) == pytest.approx(float(np.mean(list(expected.values()))), abs=TOLERANCE)
    assert expected == pytest.approx(scp_rederived(sets, refs), abs=TOLERANCE)


def test_set_scores_self_cider_reads_ptb_tokens_and_the_sets_references() -> None:
    """Table 4's Self-CIDEr: the sets' captions and the raw references PTB-tokenised (as SCP's
    eval_self_cider tokenises both), df from the references of the sets' images."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from caprl.evaluation.diversity import set_scores

    tokens, raw = coco_tokens(), coco_raw()
    ids = list(tokens)[:5]
    sets = {i: [c + ["."] for c in tokens[i][:3]] + [tokens[ids[0]][1]] for i in ids}  # '.': PTB drops it
    gts = PTBTokenizer().tokenize({i: [{"caption": r} for r in raw[i]] for i in ids})
    expected = scp_rederived({i: [c[:-1] if c[-1] == "." else c for c in sets[i]] for i in ids},
                             {i: [r.split() for r in gts[i]] for i in ids})
    got = set_scores(sets, {i: raw[i] for i in ids}, "mean")
    assert got["Self-CIDEr"] == pytest.approx(float(np.mean(list(expected.values()))), abs=TOLERANCE)
