"""SLL, SLL-ME and SLL-SLE (paper 002, eq. 15-16): weights by hand, the diversity term's
sign, the entropy term against an independent recomputation, and the losses end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pycocoevalcap.bleu.bleu_scorer import BleuScorer

from caprl import decoding
from caprl.objectives import build_objective
from caprl.errors import CaprlError
from caprl.objectives.sle import (DIVERSITY, combine, diversity_weights, leave_one_out_rewards, leave_one_out_weights,
                                  pairwise_distances, sample_weights)
from conftest import default_params
from numerics import assert_float64_close, to_float64
from test_objectives import redraw, setup
from toy import CONSTANT_LR, count_red, decode

SLL = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 3, "reward": "count_red", "temperature": 1.0}


def test_eq16_weights_on_a_hand_worked_example() -> None:
    # one image, s = 3; distances d(y_j, y_k) (symmetric, zero diagonal)
    distance = np.array([[[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]])
    # baseline b = 8/9; (2/s) * sum_k (d_jk - b) = (2/3) * (row sum - 3 * 8/9)
    np.testing.assert_allclose(diversity_weights(distance), [[2 / 9, -4 / 9, 2 / 9]], atol=1e-12)
    precision, greedy = np.array([[1.0, 0.5, 0.2]]), np.array([0.5])
    # alpha (Delta_j - Delta_greedy) + (1 - alpha) * diversity, alpha = 0.75
    expected = [0.75 * 0.5 + 0.25 * 2 / 9, 0.0 - 0.25 * 4 / 9, 0.75 * -0.3 + 0.25 * 2 / 9]
    np.testing.assert_allclose(sample_weights(precision, greedy, distance, 0.75), [expected], atol=1e-12)
    # alpha = 1 is SLL: the greedy-baselined reward alone
    np.testing.assert_allclose(sample_weights(precision, greedy, distance, 1.0), precision - 0.5, atol=1e-12)


def test_diversity_weights_of_an_image_sum_to_zero() -> None:
    rng = np.random.default_rng(0)
    d = rng.random((4, 5, 5))
    d = d + d.transpose(0, 2, 1)
    d[:, np.arange(5), np.arange(5)] = 0
    np.testing.assert_allclose(diversity_weights(d).sum(axis=1), 0.0, atol=1e-12)


def test_raising_a_samples_distance_to_the_others_raises_its_weight() -> None:
    rng = np.random.default_rng(1)
    d = rng.random((1, 5, 5))
    d = d + d.transpose(0, 2, 1)
    d[:, np.arange(5), np.arange(5)] = 0
    for j in range(5):
        farther = d.copy()
        others = [k for k in range(5) if k != j]
        farther[0, j, others] += 0.1
        farther[0, others, j] += 0.1
        before, after = diversity_weights(d)[0], diversity_weights(farther)[0]
        assert after[j] > before[j]
        assert np.all(after[others] < before[others] + 1e-12)
        # and the objective's gradient pushes log p(y_j) up harder: d loss / d log p_j = -weight_j
        assert sample_weights(np.zeros((1, 5)), np.zeros(1), farther, 0.75)[0, j] > \
            sample_weights(np.zeros((1, 5)), np.zeros(1), d, 0.75)[0, j]


def _official_bleu(candidate: list[str], reference: list[str]) -> list[float]:
    scorer = BleuScorer(n=4)
    scorer += (" ".join(candidate), [" ".join(reference)])
    return scorer.compute_score(option="closest", verbose=0)[1]


def test_distance_is_two_minus_bleu3_plus_bleu4_of_pycocoevalcap() -> None:
    a = "a red square moves to the left".split()
    b = "a red square is moving left".split()
    c = "the blue circle grows".split()
    d = pairwise_distances([[a, b, c], [a, a, c]])
    for g, group in enumerate([[a, b, c], [a, a, c]]):
        for j in range(3):
            for k in range(3):
                if j == k:
                    assert d[g, j, k] == 0.0
                else:
                    bleu = _official_bleu(group[j], group[k])
                    assert d[g, j, k] == pytest.approx(2.0 - bleu[2][0] - bleu[3][0], abs=1e-9)
    assert d[1, 0, 1] == pytest.approx(0.0, abs=1e-6)  # identical captions: no distance
    assert d[0, 0, 2] > d[0, 0, 1]  # nothing shared is farther than a paraphrase


@pytest.mark.numerics
def test_sll_me_entropy_term_is_the_mean_per_step_entropy_of_the_sampling_distribution() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the decode's entropies against a teacher-forced forward's
    plain = build_objective("sll", {**SLL, "entropy": 0.0}, env, model)
    me = build_objective("sll", {**SLL, "entropy": 0.1}, env, model)
    torch.manual_seed(5)
    loss_plain, _ = plain.loss(model, batch)
    torch.manual_seed(5)
    loss_me, stats = me.loss(model, batch)
    # recompute the entropy independently: teacher-force the sampled captions, full distributions
    ctx, _, samples = redraw(model, batch, 5)
    tokens, mask = samples.last_stage(), samples.mask[:, 0]
    with torch.no_grad():
        logp = model.teacher_forcing(decoding.expand(ctx, 3), tokens)[:, 0, : tokens.shape[1]]  # [N, T, V]
    entropy = -(logp.exp() * logp).sum(-1)
    expected = float((entropy * mask).sum() / mask.sum())
    assert_float64_close(stats["entropy"], expected)
    assert_float64_close(loss_me.detach(), loss_plain.detach() - 0.1 * expected)


@pytest.mark.numerics
def test_sll_sle_loss_is_eq15_with_the_hand_computed_weights() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's sums and the hand's may add in other orders
    objective = build_objective("sll_sle", {**SLL, "alpha": 0.75, "diversity": "pairwise"}, env, model)
    torch.manual_seed(7)
    loss, stats = objective.loss(model, batch)
    _, greedy, samples = redraw(model, batch, 7)
    words = decode(samples.last_stage())
    r_greedy = count_red(None, decode(greedy.last_stage()))
    r_sample = count_red(None, words).reshape(4, 3)
    distance = pairwise_distances([words[3 * g: 3 * g + 3] for g in range(4)])
    weights = torch.tensor(sample_weights(r_sample, r_greedy, distance, 0.75).reshape(-1))
    mask = samples.mask[:, 0]
    expected = -(weights[:, None] * samples.logprobs[:, 0] * mask).sum() / mask.sum()
    assert_float64_close(loss, expected)
    assert stats["distance"] >= 0.0


def test_sll_sle_makes_samples_more_diverse_than_sll() -> None:
    """On the toy problem, a mostly-diversity objective (alpha = 0.25) keeps the samples of an
    image farther apart than SLL after the same steps from the same start."""
    distances = {}
    for name, options in (("sll", {**SLL, "entropy": 0.0}),
                          ("sll_sle", {**SLL, "alpha": 0.25, "diversity": "pairwise"})):
        model, batch, env = setup()
        objective = build_objective(name, {**options, "n_samples": 5}, env, model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(0)
        for _ in range(40):
            loss, _ = objective.loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            ctx = model.encode(batch.pooled, batch.regions)
            words = decode(decoding.sample(model.train(), ctx, 6, n=5).last_stage())
        distances[name] = pairwise_distances([words[5 * g: 5 * g + 5] for g in range(4)]).mean()
    assert distances["sll_sle"] > distances["sll"]


# ---------------------------------------------------------------- the authors' leave-one-out variant


def _authors_diversity(groups: list[list[list[str]]]) -> np.ndarray:
    """The first author's code, step by step (caption_competition gen_model/trntst_util.py
    ``eval_bleu_diversity_in_rollout`` with min_ngram 2, max_ngram 4, and gen_model/diversity.py:
    the rewards minus their mean clipped below at -0.5), with pycocoevalcap's Bleu(4)."""
    from pycocoevalcap.bleu.bleu import Bleu

    out = []
    for group in groups:
        captions = [" ".join(c) for c in group]
        rewards = []
        for j in range(len(captions)):
            gts = {0: captions[:j] + captions[j + 1:]}
            preds = {0: captions[j:j + 1]}
            score, _ = Bleu(4).compute_score(gts, preds, verbose=0)
            rewards.append(-np.mean(score[2:4]))
        out.append(rewards)
    rewards = np.array(out)
    baseline = np.maximum(rewards.mean(axis=1), -0.5 * np.ones(len(groups)))
    return rewards - baseline[:, None]


def test_leave_one_out_diversity_equals_the_authors_code_with_pycocoevalcap() -> None:
    """Parity on real COCO captions (5 per group) and on degenerate groups: repeated samples
    (the clip at -0.5 binds: every sample is pushed down) and an empty caption."""
    from conftest_rewards import coco_tokens

    tokens = coco_tokens()
    groups = [tokens[i][:5] for i in list(tokens)[:12]]
    sentence = "a man riding a horse on a beach".split()
    groups += [[sentence] * 5, [sentence, sentence, sentence[:4], [], "two dogs play in the snow".split()]]
    got = leave_one_out_weights(leave_one_out_rewards(groups))
    np.testing.assert_allclose(got, _authors_diversity(groups), rtol=0, atol=1e-9)
    np.testing.assert_allclose(got[-2], -0.5, atol=1e-6)  # BLEU 1 everywhere: reward -1, baseline clipped to -0.5
    mean = leave_one_out_rewards(groups).mean(axis=1)
    idle = mean > -0.5  # the clip is idle: the weights of the group sum to zero; else to s (mean + 0.5) < 0
    assert idle[:12].sum() >= 6 and not idle[-2]
    np.testing.assert_allclose(got[idle].sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(got[~idle].sum(axis=1), 5 * (mean[~idle] + 0.5), atol=1e-12)
    weights, stats = DIVERSITY.get("leave_one_out")(groups)
    np.testing.assert_allclose(weights, got)
    assert np.abs(DIVERSITY.get("pairwise")(groups)[0] - weights).max() > 0.1  # not the paper's term
    assert stats["diversity_reward"] == pytest.approx(leave_one_out_rewards(groups).mean())


@pytest.mark.numerics
def test_sll_sle_leave_one_out_loss_uses_the_authors_weights_without_2_over_s() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's sums and the hand's may add in other orders
    objective = build_objective("sll_sle", {**SLL, "alpha": 0.75, "diversity": "leave_one_out"}, env, model)
    torch.manual_seed(7)
    loss, stats = objective.loss(model, batch)
    _, greedy, samples = redraw(model, batch, 7)
    words = decode(samples.last_stage())
    groups = [words[3 * g: 3 * g + 3] for g in range(4)]
    r_greedy = count_red(None, decode(greedy.last_stage()))
    r_sample = count_red(None, words).reshape(4, 3)
    diversity = leave_one_out_weights(leave_one_out_rewards(groups))
    weights = torch.tensor(combine(r_sample, r_greedy, diversity, 0.75).reshape(-1))
    mask = samples.mask[:, 0]
    expected = -(weights[:, None] * samples.logprobs[:, 0] * mask).sum() / mask.sum()  # per token, as the code
    assert_float64_close(loss, expected)
    assert "diversity_reward" in stats and "distance" not in stats


def test_the_default_diversity_is_the_papers_and_unknown_ones_are_errors() -> None:
    assert default_params()["objectives"]["sll_sle"]["diversity"] == "pairwise"
    assert set(DIVERSITY) == {"pairwise", "leave_one_out"}
    model, _, env = setup()
    with pytest.raises(CaprlError, match="options.diversity: expected one of leave_one_out, pairwise, got 'mean'"):
        build_objective("sll_sle", {**SLL, "alpha": 0.75, "diversity": "mean"}, env, model)
    with pytest.raises(CaprlError, match="diversity missing"):
        build_objective("sll_sle", {**SLL, "alpha": 0.75}, env, model)
