"""SLL, SLL-ME and SLL-SLE (paper 002, eq. 15-16): weights by hand, the diversity term's
sign, the entropy term against an independent recomputation, and the losses end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pycocoevalcap.bleu.bleu_scorer import BleuScorer

from caprl import decoding
from caprl.objectives import build_objective
from caprl.objectives.sle import diversity_weights, pairwise_distances, sample_weights
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


def test_sll_me_entropy_term_is_the_mean_per_step_entropy_of_the_sampling_distribution() -> None:
    model, batch, env = setup()
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
    assert stats["entropy"] == pytest.approx(expected, rel=1e-5)
    assert loss_me.item() == pytest.approx(loss_plain.item() - 0.1 * expected, rel=1e-5)


def test_sll_sle_loss_is_eq15_with_the_hand_computed_weights() -> None:
    model, batch, env = setup()
    objective = build_objective("sll_sle", {**SLL, "alpha": 0.75}, env, model)
    torch.manual_seed(7)
    loss, stats = objective.loss(model, batch)
    _, greedy, samples = redraw(model, batch, 7)
    words = decode(samples.last_stage())
    r_greedy = count_red(None, decode(greedy.last_stage()))
    r_sample = count_red(None, words).reshape(4, 3)
    distance = pairwise_distances([words[3 * g: 3 * g + 3] for g in range(4)])
    weights = torch.tensor(sample_weights(r_sample, r_greedy, distance, 0.75).reshape(-1), dtype=torch.float32)
    mask = samples.mask[:, 0]
    expected = -(weights[:, None] * samples.logprobs[:, 0] * mask).sum() / mask.sum()
    assert torch.isclose(loss, expected, atol=1e-6)
    assert stats["distance"] >= 0.0


def test_sll_sle_makes_samples_more_diverse_than_sll() -> None:
    """On the toy problem, a mostly-diversity objective (alpha = 0.25) keeps the samples of an
    image farther apart than SLL after the same steps from the same start."""
    distances = {}
    for name, options in (("sll", {**SLL, "entropy": 0.0}), ("sll_sle", {**SLL, "alpha": 0.25})):
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
