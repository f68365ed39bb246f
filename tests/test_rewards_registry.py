"""The reward registry: names, mixes, SPICE refusal, external scorers closed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest_rewards import held_out

from caprl.errors import CaprlError
from caprl.metrics.official import spice_unavailable_reason
from caprl.rewards import MIXES, available_rewards, build_reward

REFS = {
    1: [["a", "dog", "runs", "on", "the", "grass"], ["the", "brown", "dog", "is", "running"]],
    2: [["a", "cat", "sits", "on", "a", "mat"], ["cat", "sitting", "on", "the", "mat"]],
}
CAPS = [["a", "dog", "is", "running"], ["a", "cat", "on", "the", "mat"], []]
IDS = [1, 2, 2]


def test_names():
    names = available_rewards()
    for name in ["cider_d", "bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "spice", "spider", "bcmr"]:
        assert name in names
    with pytest.raises(CaprlError, match="unknown reward 'cidr'"):
        build_reward("cidr", REFS)
    with pytest.raises(CaprlError, match="bad options"):
        build_reward("bleu4", REFS, sigma=3.0)


def test_mix_is_the_weighted_sum_of_its_components():
    ids, cands, refs = held_out(100)
    weights = {"cider_d": 0.7, "bleu4": 2.0, "rouge_l": 0.5}
    mix = build_reward("bcmr", refs, weights=weights)
    expected = sum(w * build_reward(k, refs)(ids, cands) for k, w in weights.items())
    np.testing.assert_allclose(mix(ids, cands), expected, rtol=0, atol=1e-12)
    with pytest.raises(CaprlError, match="unknown component"):
        build_reward("bcmr", refs, weights={"cider": 1.0})


@pytest.mark.skipif(spice_unavailable_reason() is None, reason="SPICE can run here")
def test_spice_and_spider_refuse_to_build_with_the_reason():
    with pytest.raises(CaprlError, match="spice.*unavailable.*CoreNLP"):
        build_reward("spice", REFS)
    with pytest.raises(CaprlError, match="spider"):
        build_reward("spider", REFS)
    assert MIXES["spider"] == {"cider_d": 0.5, "spice": 0.5}


def test_bcmr_needs_explicit_weights():
    with pytest.raises(CaprlError, match="needs explicit weights"):
        build_reward("bcmr", REFS)


def test_bcmr_with_meteor_runs_one_jvm_and_closes_it():
    reward = build_reward("bcmr", REFS, weights={"bleu4": 0.5, "cider_d": 1.0, "meteor": 1.0, "rouge_l": 0.5})
    first = reward(IDS, CAPS)
    meteor = reward.components["meteor"]
    process = meteor._scorer._meteor.meteor_p
    second = reward(IDS, CAPS)
    assert meteor._scorer._meteor.meteor_p is process  # same JVM for every call
    np.testing.assert_array_equal(first, second)
    assert first[0] > first[2] == 0.0
    scores = meteor(IDS, CAPS)
    assert 0 < scores[0] <= 1 and scores[2] == 0
    reward.close()
    assert process.poll() is not None


def test_build_mix_routes_options_to_the_components_that_take_them():
    from caprl.rewards import build_mix

    ids, caps = [1, 2], CAPS[:2]
    mix = build_mix("m", {"cider_d": 1.0, "bleu1": 0.5}, REFS, sigma=3.0)
    expected = build_reward("cider_d", REFS, sigma=3.0)(ids, caps) + 0.5 * build_reward("bleu1", REFS)(ids, caps)
    np.testing.assert_allclose(mix(ids, caps), expected, rtol=0, atol=1e-12)
    with pytest.raises(CaprlError, match=r"bad options \['corenlp_dir'\]"):
        build_mix("m", {"cider_d": 1.0}, REFS, corenlp_dir="/x")


@pytest.mark.parametrize("name", ["meteor", "rouge_l"])
def test_string_metrics_score_each_distinct_caption_once_with_the_scorers_own_numbers(name):
    """PG-SPIDEr's roll-outs repeat captions: each distinct (image, caption) is scored once, and
    every score equals the scorer's own on the whole batch at once (METEOR: one JVM request)."""
    ids, cands, refs = held_out(40)
    batch_ids, batch = ids + ids[:25] + ids[5:15], cands + cands[:25] + cands[5:15]  # repeats
    reward = build_reward(name, refs)
    try:
        reward.cache_size = 30  # small enough to be emptied on the way
        direct = reward.score(batch_ids, batch)
        first, second = reward(batch_ids[:50], batch[:50]), reward(batch_ids[50:], batch[50:])
        np.testing.assert_array_equal(np.concatenate([first, second]), direct)
        distinct = len(set(zip(batch_ids, map(tuple, batch))))
        assert distinct < len(batch) and reward.scored <= distinct + 30
        asked = reward.scored
        np.testing.assert_array_equal(reward(batch_ids[50:], batch[50:]), second)  # still cached: no new request
        assert reward.scored == asked
    finally:
        reward.close()


def test_rouge_l_reward_equals_pycocoevalcaps_rouge_bit_for_bit():
    """The bit-parallel LCS gives pycocoevalcap's ROUGE-L floats exactly: on held-out COCO
    captions and on random word sequences with repeats, empty captions and 1-word references."""
    import random

    from pycocoevalcap.rouge.rouge import Rouge, my_lcs

    from caprl.rewards.rouge import ReferenceMasks

    official = Rouge()
    ids, cands, refs = held_out(300)
    ours = build_reward("rouge_l", refs)(ids, cands)
    expected = [official.calc_score([" ".join(c)], [" ".join(r) for r in refs[i]]) for i, c in zip(ids, cands)]
    assert ours.tolist() == expected
    rng, words = random.Random(0), "a b c the dog cat on mat".split()
    toy = {i: [rng.choices(words, k=rng.randint(1, 18)) for _ in range(rng.randint(1, 5))] for i in range(200)}
    toy_caps = [rng.choices(words, k=rng.randint(0, 18)) for _ in toy]
    ours = build_reward("rouge_l", toy)(list(toy), toy_caps)
    expected = [official.calc_score([" ".join(c)], [" ".join(r) for r in toy[i]]) for i, c in zip(toy, toy_caps)]
    assert ours.tolist() == expected
    for i, c in zip(toy, toy_caps):
        for r in toy[i]:
            assert ReferenceMasks(" ".join(r)).lcs(c or [""]) == my_lcs(r, c or [""])
