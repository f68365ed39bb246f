"""BLEU: corpus and sentence scores equal pycocoevalcap's Bleu on real COCO text."""

from __future__ import annotations

import numpy as np
import pytest
from conftest_rewards import coco_tokens, held_out, perturb
from pycocoevalcap.bleu.bleu import Bleu as OfficialBleu

from caprl.errors import CaprlError
from caprl.rewards import build_reward, corpus_bleu, leave_one_out_bleu, pairwise_bleu, sentence_bleu
from caprl.rewards.bleu import bleu_against, bleu_stats
from caprl.rewards.references import ReferenceSet

N_IMAGES = 500


def official_bleu(candidates, references) -> tuple[np.ndarray, np.ndarray]:
    gts = {k: [" ".join(r) for r in refs] for k, refs in enumerate(references)}
    res = {k: [" ".join(c)] for k, c in enumerate(candidates)}
    corpus, per = OfficialBleu(4).compute_score(gts, res, verbose=0)
    return np.asarray(corpus), np.asarray(per).T


@pytest.mark.parametrize("kind", ["held_out", "perturbed"])
def test_corpus_and_sentence_bleu_equal_pycocoevalcap(kind):
    ids, cands, refs = held_out(N_IMAGES)
    if kind == "perturbed":
        vocab = sorted({w for caps in refs.values() for c in caps for w in c})
        cands = perturb(cands, vocab, seed=2)
    stats = bleu_stats(ReferenceSet(refs), ids, cands)
    corpus, per = official_bleu(cands, [refs[i] for i in ids])
    np.testing.assert_allclose(corpus_bleu(stats), corpus, rtol=0, atol=1e-9)
    np.testing.assert_allclose(sentence_bleu(stats), per, rtol=0, atol=1e-9)
    assert per[:, 3].std() > 0.05


def test_bleu_rewards_are_pycocoevalcap_sentence_scores():
    ids, cands, refs = held_out(200)
    _, per = official_bleu(cands, [refs[i] for i in ids])
    for n in range(1, 5):
        reward = build_reward(f"bleu{n}", refs)
        np.testing.assert_allclose(reward(ids, cands), per[:, n - 1], rtol=0, atol=1e-9)


def test_closest_reference_length_ties_go_to_the_shorter():
    cand = [["a", "b", "c", "d"]]
    refs = [[["a", "b", "c"], ["a", "b", "c", "d", "e"]]]
    stats = bleu_against(cand, refs)
    assert stats.reflen.tolist() == [3]
    np.testing.assert_allclose(sentence_bleu(stats), official_bleu(cand, refs)[1], rtol=0, atol=1e-12)


def test_leave_one_out_and_pairwise_bleu_equal_pycocoevalcap():
    tokens = coco_tokens()
    groups = [tokens[i][:5] for i in list(tokens)[:100]]
    cands, refs = [], []
    for group in groups:
        for j, sample in enumerate(group):
            cands.append(sample)
            refs.append([s for k, s in enumerate(group) if k != j])
    np.testing.assert_allclose(leave_one_out_bleu(groups), official_bleu(cands, refs)[1], rtol=0, atol=1e-9)

    pair = pairwise_bleu(groups[:3])
    assert pair[0].shape == (5, 5, 4) and np.isnan(pair[0][0, 0]).all()
    for g, group in enumerate(groups[:3]):
        for j in range(5):
            for k in range(5):
                if j != k:
                    expected = official_bleu([group[j]], [[group[k]]])[1][0]
                    np.testing.assert_allclose(pair[g][j, k], expected, rtol=0, atol=1e-12)


def test_group_errors():
    with pytest.raises(CaprlError, match="at least 2"):
        leave_one_out_bleu([[["a", "b"]]])
    with pytest.raises(CaprlError, match="order must be"):
        from caprl.rewards.bleu import Bleu

        Bleu(ReferenceSet({1: [["a"]]}), n=5)


def test_pairwise_bleu_on_uneven_groups_equals_pycocoevalcap_pair_by_pair():
    """Groups of 0, 1, 2 and 5 samples, repeated n-grams and an empty caption: every pair is
    pycocoevalcap's sentence BLEU with the other sample as the only reference."""
    tokens = coco_tokens()
    ids = list(tokens)
    groups = [[], [tokens[ids[0]][0]], [tokens[ids[1]][0], tokens[ids[1]][0][:3]],
              [tokens[ids[2]][j] for j in range(4)] + [["a", "a", "a", "man", "a", "a"]],
              [["a", "dog", "a", "dog"], [], ["a", "dog"]]]
    pair = pairwise_bleu(groups)
    assert [p.shape for p in pair] == [(0, 0, 4), (1, 1, 4), (2, 2, 4), (5, 5, 4), (3, 3, 4)]
    for g, group in enumerate(groups):
        for j in range(len(group)):
            assert np.isnan(pair[g][j, j]).all()
            for k in range(len(group)):
                if j != k:
                    expected = official_bleu([group[j]], [[group[k]]])[1][0]
                    np.testing.assert_allclose(pair[g][j, k], expected, rtol=0, atol=1e-12)
