"""Rewards by configuration (params ``rewards:``): real components, validation, SPICE availability."""

from __future__ import annotations

import numpy as np
import pytest
from conftest_rewards import held_out

import caprl.metrics.official as official
from caprl.errors import CaprlError
from caprl.metrics.official import CORENLP_JARS, spice_unavailable_reason
from caprl.rewards import build_configured_reward, build_reward, compute_document_frequencies, reward_unavailable_reason

BCMR_WEIGHTS = {"bleu4": 0.25, "cider_d": 0.25, "meteor": 0.25, "rouge_l": 0.25}
PARAMS = {
    "rewards": {
        "cider_d": {"kind": "cider_d"},
        "sharp_cider": {"kind": "cider_d", "sigma": 3.0},
        "bleu": {"kind": "bleu2"},
        "bcmr": {"kind": "mix", "weights": BCMR_WEIGHTS},
        "spider": {"kind": "mix", "weights": {"cider_d": 0.5, "spice": 0.5}},
        "spice_only": {"kind": "spice"},
    },
    "spice": {"corenlp_dir": None},
}
REFS = {
    1: [["a", "dog", "runs", "on", "the", "grass"], ["the", "brown", "dog", "is", "running"]],
    2: [["a", "cat", "sits", "on", "a", "mat"], ["cat", "sitting", "on", "the", "mat"]],
}
SPICE_MISSING = spice_unavailable_reason()


def test_configured_bcmr_is_the_weighted_sum_of_its_components():
    ids, cands, refs = held_out(60)
    df = compute_document_frequencies(refs)
    with build_configured_reward("bcmr", PARAMS, refs, df) as bcmr:
        assert bcmr.name == "bcmr" and bcmr.weights == BCMR_WEIGHTS
        got = bcmr(ids, cands)
    expected = np.zeros(len(ids))
    for kind, weight in BCMR_WEIGHTS.items():
        with build_reward(kind, refs, df) as component:
            expected += weight * component(ids, cands)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert got.min() > 0


def test_configured_single_rewards_take_their_options():
    ids, cands, refs = held_out(40)
    df = compute_document_frequencies(refs)
    sharp = build_configured_reward("sharp_cider", PARAMS, refs, df)
    assert sharp.name == "sharp_cider"
    np.testing.assert_array_equal(sharp(ids, cands), build_reward("cider_d", refs, df, sigma=3.0)(ids, cands))
    assert not np.array_equal(sharp(ids, cands), build_reward("cider_d", refs, df)(ids, cands))
    bleu = build_configured_reward("bleu", PARAMS, refs, None)
    np.testing.assert_array_equal(bleu(ids, cands), build_reward("bleu2", refs)(ids, cands))


def test_mix_sigma_goes_to_its_cider_component():
    params = {"rewards": {"m": {"kind": "mix", "weights": {"cider_d": 2.0, "bleu1": 1.0}, "sigma": 3.0}}}
    ids, caps = [1, 2], [["a", "dog", "is", "running"], ["a", "cat", "on", "the", "mat"]]
    got = build_configured_reward("m", params, REFS, None)(ids, caps)
    expected = 2.0 * build_reward("cider_d", REFS, sigma=3.0)(ids, caps) + build_reward("bleu1", REFS)(ids, caps)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("rewards", "key"),
    [
        ({"x": {"kind": "cidr"}}, r"rewards\.x\.kind: unknown kind 'cidr'"),
        ({"x": {"sigma": 2.0}}, r"rewards\.x\.kind: unknown kind None"),
        ({"x": {"kind": "cider_d", "gamma": 1}}, r"rewards\.x\.gamma: unknown option"),
        ({"x": {"kind": "bleu4", "sigma": 6.0}}, r"rewards\.x\.sigma: unknown option for kind 'bleu4'"),
        ({"x": {"kind": "cider_d", "sigma": -1}}, r"rewards\.x\.sigma: must be a positive number"),
        ({"x": {"kind": "mix"}}, r"rewards\.x\.weights: required"),
        ({"x": {"kind": "mix", "weights": {}}}, r"rewards\.x\.weights: must be a non-empty mapping"),
        ({"x": {"kind": "mix", "weights": {"cider": 1.0}}}, r"rewards\.x\.weights\.cider: unknown component"),
        ({"x": {"kind": "mix", "weights": {"bleu4": "high"}}}, r"rewards\.x\.weights\.bleu4: weight must be a number"),
        ({"x": {"kind": "mix", "weights": {"spider": 1.0}}}, r"rewards\.x\.weights\.spider: unknown component"),
        ({"x": "cider_d"}, r"rewards\.x: must be a mapping"),
        ({"y": {"kind": "cider_d"}}, r"rewards\.x: no such reward in params\.yaml \(configured: y\)"),
    ],
)
def test_bad_configuration_names_the_key(rewards, key):
    with pytest.raises(CaprlError, match=key):
        reward_unavailable_reason("x", {"rewards": rewards})
    with pytest.raises(CaprlError, match=key):
        build_configured_reward("x", {"rewards": rewards}, REFS, None)


def test_missing_sections_and_bad_spice_section():
    with pytest.raises(CaprlError, match=r"rewards\.cider_d: no such reward.*configured: none"):
        reward_unavailable_reason("cider_d", {})
    bad = {**PARAMS, "spice": {"corenlp_dir": 3}}
    with pytest.raises(CaprlError, match=r"spice\.corenlp_dir: must be a path or null"):
        reward_unavailable_reason("spider", bad)
    with pytest.raises(CaprlError, match=r"spice: must be a mapping"):
        reward_unavailable_reason("spider", {**PARAMS, "spice": "yes"})


def test_non_spice_rewards_are_available_without_looking_for_java(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("SPICE lookup for a reward without SPICE")

    monkeypatch.setattr(official, "spice_classpath", forbidden)
    for name in ("cider_d", "sharp_cider", "bleu", "bcmr"):
        assert reward_unavailable_reason(name, PARAMS) is None
    assert reward_unavailable_reason("cider_d", {"rewards": PARAMS["rewards"]}) is None  # no spice: section


@pytest.mark.skipif(SPICE_MISSING is None, reason="SPICE can run here")
def test_spider_is_unavailable_here_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.delenv("CAPRL_CORENLP_DIR", raising=False)
    reason = reward_unavailable_reason("spider", PARAMS)
    assert reason is not None and "'spider'" in reason and "CoreNLP" in reason and "spice.corenlp_dir" in reason
    assert reward_unavailable_reason("spice_only", {"rewards": PARAMS["rewards"]}) is not None  # no spice: section
    with pytest.raises(CaprlError, match="spider.*CoreNLP"):
        build_configured_reward("spider", PARAMS, REFS, None)
    # the configured folder and $CAPRL_CORENLP_DIR are both looked in, and named in the reason
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv("CAPRL_CORENLP_DIR", str(env_dir))
    params = {**PARAMS, "spice": {"corenlp_dir": str(tmp_path / "corenlp")}}
    reason = reward_unavailable_reason("spice_only", params)
    assert str(tmp_path / "corenlp") in reason and str(env_dir) in reason


def test_corenlp_jars_are_found_in_the_configured_folder(monkeypatch, tmp_path):
    """File detection only (empty stand-in jars): that SPICE then really runs is test_spice_server's job."""
    if official.shutil.which("java") is None:
        pytest.skip("no java")
    monkeypatch.delenv("CAPRL_CORENLP_DIR", raising=False)
    for name in CORENLP_JARS:
        (tmp_path / name).write_bytes(b"")
    params = {**PARAMS, "spice": {"corenlp_dir": str(tmp_path)}}
    assert reward_unavailable_reason("spider", params) is None
    classpath = official.spice_classpath(str(tmp_path))
    assert classpath[0].name == "spice-1.0.jar" and classpath[-2:] == [tmp_path / n for n in CORENLP_JARS]
    monkeypatch.setenv("CAPRL_CORENLP_DIR", str(tmp_path))
    assert reward_unavailable_reason("spider", {"rewards": PARAMS["rewards"]}) is None
