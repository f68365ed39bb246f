"""Div-1, Div-2, mBLEU-4 (SLE paper sec. 3.2)."""

from __future__ import annotations

import numpy as np
import torch
import pytest
from conftest_rewards import coco_tokens
from pycocoevalcap.bleu.bleu import Bleu

from caprl.errors import CaprlError
from caprl.evaluation.diversity import diversity, div_n


def test_div_n_by_hand():
    caps = [["a", "dog", "runs"], ["a", "dog", "sits"]]
    assert div_n(caps, 1) == pytest.approx(4 / 6)  # a, dog, runs, sits over 6 words
    assert div_n(caps, 2) == pytest.approx(3 / 6)  # (a dog), (dog runs), (dog sits)
    assert div_n([[], []], 1) == 0.0


def test_identical_captions_are_less_diverse():
    same = {1: [["a", "man", "riding", "a", "horse", "on", "a", "beach"]] * 5}
    varied = {1: [c for c in coco_tokens()[next(iter(coco_tokens()))][:5]]}
    d_same, d_varied = diversity(same), diversity(varied)
    assert d_same["mBLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert d_same["Div-1"] == pytest.approx(6 / 40)
    assert d_varied["Div-1"] > d_same["Div-1"] and d_varied["Div-2"] > d_same["Div-2"]
    assert d_varied["mBLEU-4"] < 0.5


def test_mbleu_is_the_mean_of_leave_one_out_pycocoevalcap_bleu4():
    tokens = coco_tokens()
    images = {i: tokens[i][:5] for i in list(tokens)[:20]}
    expected = []
    for caps in images.values():
        gts = {j: [" ".join(o) for k, o in enumerate(caps) if k != j] for j in range(5)}
        res = {j: [" ".join(caps[j])] for j in range(5)}
        expected.append(np.mean(Bleu(4).compute_score(gts, res, verbose=0)[1][3]))
    got = diversity(images)
    assert got["mBLEU-4"] == pytest.approx(np.mean(expected), abs=1e-12)
    assert got["Div-1"] == pytest.approx(np.mean([div_n(c, 1) for c in images.values()]))


def test_errors():
    with pytest.raises(CaprlError, match="image 3 has 1 caption"):
        diversity({3: [["a"]]})
    with pytest.raises(CaprlError, match="no images"):
        diversity({})


def test_set_scores_cider_is_the_official_cider_d_mean_or_top_caption():
    """Table 4's CIDEr-D column: pycocoevalcap's CIDEr-D (PTB-tokenised, df from the references,
    as coco-caption does) of every caption of the sets, reduced per decoding: ``mean`` over
    every caption (rs, paper 002 sec. 5.4), ``top`` = the first caption's (bs: the top beam,
    the official corpus CIDEr-D of those captions, as the run's main beam score)."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from caprl.evaluation.diversity import TABLE4_PRECISION, set_scores

    tokens = coco_tokens()
    ids = list(tokens)[:6]
    references = {i: [" ".join(c) for c in tokens[i][:4]] for i in ids}
    sets = {i: [tokens[i][4], tokens[ids[(k + 1) % 6]][0], tokens[i][4][:3]] for k, i in enumerate(ids)}
    gts = PTBTokenizer().tokenize({i: [{"caption": r} for r in references[i]] for i in ids})
    corpus, per_caption = [], []
    for j in range(3):  # one caption per image per official call: df from the 6 images' references
        res = PTBTokenizer().tokenize({i: [{"caption": " ".join(sets[i][j])}] for i in ids})
        score, scores = Cider().compute_score(gts, res)
        corpus.append(score)
        per_caption.extend(scores)
    mean, top = set_scores(sets, references, "mean"), set_scores(sets, references, "top")
    assert mean["CIDEr-D"] == pytest.approx(float(np.mean(per_caption)), abs=1e-9)
    assert top["CIDEr-D"] == pytest.approx(corpus[0], abs=1e-9)  # the first captions' official score
    assert top["CIDEr-D"] != pytest.approx(mean["CIDEr-D"], abs=1e-3)
    assert top["CIDEr-D_mean"] == mean["CIDEr-D_mean"] == pytest.approx(mean["CIDEr-D"], abs=1e-12)
    assert set(top) == {"CIDEr-D", "CIDEr-D_mean", "Div-1", "Div-2", "mBLEU-4", "Self-CIDEr"}
    assert top["Div-1"] == pytest.approx(diversity(sets)["Div-1"])
    assert TABLE4_PRECISION == {"rs": "mean", "bs": "top"}  # the paper's: rs averaged, bs the top beam
    with pytest.raises(CaprlError, match="unknown precision 'median'"):
        set_scores(sets, references, "median")


def test_greedy_report_is_the_official_cider_d_of_the_greedy_captions() -> None:
    """``evaluate.greedy``: the greedy captions (validation's decoding) scored by pycocoevalcap's
    CIDEr-D with df from the split's references; a greedy main decoding is not decoded twice."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from caprl.evaluation.run import decoded_captions, greedy_report
    from caprl.evaluation.settings import EvalSettings
    from caprl.models import build_model
    from conftest import default_params
    from toy import FEAT, WORDS, ToyData

    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0, "cell": "lstm"}, len(WORDS), FEAT,
                        3).eval()  # a random tanh model says words greedily; the maxout one may end at once
    data, ids = ToyData(), ToyData().split_ids("val")
    params = default_params()
    params["evaluate"]["batch_size"], params["decode"]["max_length"] = 3, 6
    settings = EvalSettings.from_params(params)
    greedy = decoded_captions(model, data, ids, "greedy", 3, max_length=6)
    others = ["a red circle", "a blue square", "a red square"]
    references = {i: others[: 1 + k % 3] + [greedy[i]] * (k % 2) for k, i in enumerate(ids)}  # half say it
    report = greedy_report(model, data, ids, references, settings)
    gts = PTBTokenizer().tokenize({i: [{"caption": r} for r in references[i]] for i in ids})
    res = PTBTokenizer().tokenize({i: [{"caption": greedy[i]}] for i in ids})
    official = Cider().compute_score(gts, res)[0]
    assert official > 0.1 and report == {"metrics": {"CIDEr-D": pytest.approx(official, abs=1e-9)}}
    given = {i: "a red circle" for i in ids}  # the main decoding's greedy captions: scored as given
    res = PTBTokenizer().tokenize({i: [{"caption": given[i]}] for i in ids})
    assert greedy_report(model, data, ids, references, settings, given)["metrics"]["CIDEr-D"] == pytest.approx(
        Cider().compute_score(gts, res)[0], abs=1e-9) != pytest.approx(official)


def test_the_bs_set_is_the_evaluations_own_beam_search_when_the_widths_match() -> None:
    """One beam search gives the evaluated captions (its best beam) and Table 4's bs set: the same
    captions as the beam decoder, the same bs set as its own top-k search (issue 21: no repeated work)."""
    from caprl import decoding
    from caprl.evaluation.run import decoded_captions, decoded_sets, diversity_sets, shares_the_beams
    from caprl.evaluation.settings import EvalSettings
    from caprl.models import build_model
    from conftest import default_params
    from toy import FEAT, WORDS, ToyData

    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0, "cell": "lstm"}, len(WORDS), FEAT,
                        3).eval()  # a random tanh model says words greedily; the maxout one may end at once
    data, ids = ToyData(), ToyData().split_ids("val")
    params = default_params()
    params["seed"], params["evaluate"]["batch_size"], params["decode"]["max_length"] = 3, 3, 6
    params["evaluate"]["diversity"].update(samples=2, beams=3)
    params = EvalSettings.from_params(params)
    decode = {"method": "beam", "beam_size": 3, "max_length": 6}
    assert shares_the_beams(params, decode)
    assert not shares_the_beams(params, {**decode, "beam_size": 2})
    assert not shares_the_beams(params, {**decode, "method": "greedy"})
    beams = decoded_sets(model, data, ids, "top_k_beams", 3, beam_size=3, n=3, max_length=6)
    assert {i: " ".join(caps[0]) for i, caps in beams.items()} == \
        decoded_captions(model, data, ids, "beam", 3, beam_size=3, max_length=6)

    searches = []
    real = decoding.beam_search

    def counted(*args, **kwargs):
        searches.append(1)
        return real(*args, **kwargs)

    decoding.beam_search = counted
    try:
        shared = diversity_sets(model, data, ids, params, bs=beams)
        assert not searches  # the given beams are used, not searched again
        own = diversity_sets(model, data, ids, params)
        assert searches
    finally:
        decoding.beam_search = real
    assert shared == own  # the same rs samples (seeded) and the same bs set


def test_ptb_tokens_are_pycocoevalcaps_and_each_sentence_goes_to_the_jvm_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The references of a split are tokenised once per job however many caption sets it scores;
    the tokens are pycocoevalcap's, sentence by sentence (its tokenizer reads one per line)."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from caprl.metrics import official

    monkeypatch.setattr(official, "_PTB_TOKENS", {})
    calls: list[int] = []
    real = PTBTokenizer.tokenize

    def counted(self, captions):
        calls.append(sum(len(v) for v in captions.values()))
        return real(self, captions)

    monkeypatch.setattr(PTBTokenizer, "tokenize", counted)
    texts = {1: ["A man, riding a horse.", "a MAN riding a horse!"], 2: ["", "two dogs ... playing"],
             3: ["A man, riding a horse."], 4: []}
    tokens = official.ptb_tokenize(texts)
    direct = real(PTBTokenizer(), {k: [{"caption": c} for c in v] for k, v in texts.items() if v})
    assert tokens == {**direct, 4: []} and calls == [4]  # 5 sentences, 4 distinct: one call
    assert official.ptb_tokenize({"again": texts[1] + texts[3]}) == {"again": direct[1] + direct[3]}
    assert calls == [4]  # nothing new: no JVM
    official.ptb_tokenize({"more": ["A man, riding a horse.", "A cat."]})
    assert calls == [4, 1]  # only the new sentence
