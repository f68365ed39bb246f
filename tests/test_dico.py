"""DiCO (caprl.objectives.dico): the losers' weights softmax(tau (r_w - r_j)) and the one-logit
loss against hand computations; one loser (any tau) is DPO, tau 0 weighs the losers evenly, a
large tau picks the worst; the candidates are the beams and their log-probabilities the search's;
the reference is the start, frozen, checkpointed and restored; it learns the toy reward."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from caprl import decoding
from caprl.errors import CaprlError
from caprl.models import build_model
from caprl.objectives import build_objective
from caprl.objectives.dico import dico_terms, loser_weights  # (registers dico)
from numerics import assert_float64_close, to_float64
from test_objectives import setup
from toy import CONSTANT_LR, WORDS, count_red, fit, reward_trace, same, snapshot, toy_trainer

DICO = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "candidates": 3, "reward": "count_red", "beta": 0.2, "tau": 300.0,
        "candidate_mode": "train"}


def softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x - max(xs)) for x in xs]
    return [v / sum(e) for v in e]


def test_loser_weights_are_a_softmax_of_the_reward_gaps_over_the_losers() -> None:
    rewards = torch.tensor([[1.0, 3.0, 2.0, 0.0],  # winner 1; gaps 2, 1, 3
                            [2.0, 2.0, 1.0, 2.0]], dtype=torch.float64)  # a tie: the first (likelier beam) wins; gaps 0, 1, 0
    got = loser_weights(rewards, tau=0.5)
    a, b, c = softmax([0.5 * 2, 0.5 * 1, 0.5 * 3])
    d, e, f = softmax([0.0, 0.5 * 1, 0.0])
    assert_float64_close(got, torch.tensor([[a, 0.0, b, c], [0.0, d, e, f]], dtype=torch.float64))
    assert got[0, 3] > got[0, 0] > got[0, 2]  # the worse a loser, the more weight
    third = 1 / 3
    even = torch.tensor([[third, 0, third, third], [0, third, third, third]], dtype=torch.float64)
    assert_float64_close(loser_weights(rewards, tau=0.0), even)
    assert torch.equal(loser_weights(torch.tensor([[0.3, 0.7]]), tau=300.0), torch.tensor([[1.0, 0.0]]))  # one loser
    assert torch.equal(loser_weights(torch.tensor([[0.5], [1.0]]), tau=1.0), torch.zeros(2, 1))  # no loser: no weight


def test_the_loss_matches_a_hand_computation_and_is_a_global_mean() -> None:
    model, _, env = setup()
    policy = torch.tensor([[-2.0, -3.0, -1.5], [-4.0, -1.0, -2.5]])
    ref = torch.tensor([[-2.5, -2.0, -1.0], [-3.0, -1.5, -2.0]])
    rewards = torch.tensor([[0.2, 0.9, 0.4], [1.0, 0.1, 0.5]])
    beta, tau = 0.2, 3.0
    expected, margins = [], []
    for i in range(2):
        r = rewards[i].tolist()
        w = r.index(max(r))
        losers = [j for j in range(3) if j != w]
        gamma = softmax([tau * (r[w] - r[j]) for j in losers])
        z = (float(policy[i, w]) - sum(g * float(policy[i, j]) for g, j in zip(gamma, losers))) - (
            float(ref[i, w]) - sum(g * float(ref[i, j]) for g, j in zip(gamma, losers)))
        expected.append(math.log1p(math.exp(-beta * z)))  # -log sigmoid(beta z)
        margins.append(beta * z)
    objective = build_objective("dico", {**DICO, "beta": beta, "tau": tau}, env, model)
    loss, stats = objective.pair_loss(policy, ref, rewards)
    assert math.isclose(float(loss), sum(expected) / 2, rel_tol=1e-6)
    assert math.isclose(stats["implicit_margin"], sum(margins) / 2, rel_tol=1e-6)
    assert stats["implicit_accuracy"] == sum(m > 0 for m in margins) / 2
    assert math.isclose(stats["reward_best"], 0.95, rel_tol=1e-6)
    # two processes with this same batch: each divides its sum by the global count of images, times 2
    ddp = build_objective("dico", {**DICO, "beta": beta, "tau": tau},
                          dataclasses.replace(env, global_sum=lambda x: 2 * x, world_size=2), model)
    loss2, stats2 = ddp.pair_loss(policy, ref, rewards)
    assert math.isclose(float(loss2), float(loss), rel_tol=1e-6) and stats2 == pytest.approx(stats)


def dpo(pw: torch.Tensor, pl: torch.Tensor, rw: torch.Tensor, rl: torch.Tensor, beta: float) -> torch.Tensor:
    """Rafailov et al. 2023, eq. 7: -log sigmoid(beta log pi(w)/ref(w) - beta log pi(l)/ref(l))."""
    return -torch.nn.functional.logsigmoid(beta * (pw - rw) - beta * (pl - rl))


@pytest.mark.parametrize("tau", [0.0, 1.0, 300.0])
def test_one_loser_is_dpo_and_tau_zero_weighs_the_losers_evenly(tau: float) -> None:
    model, _, env = setup()
    torch.manual_seed(1)
    policy, ref, rewards = -3 * torch.rand(6, 2, dtype=torch.float64), -3 * torch.rand(6, 2, dtype=torch.float64), torch.rand(6, 2, dtype=torch.float64)
    w = rewards.argmax(1, keepdim=True)
    pick = lambda x, idx: x.gather(1, idx).squeeze(1)  # noqa: E731
    objective = build_objective("dico", {**DICO, "candidates": 2, "tau": tau}, env, model)
    loss, _ = objective.pair_loss(policy, ref, rewards)
    assert_float64_close(loss, dpo(pick(policy, w), pick(policy, 1 - w), pick(ref, w), pick(ref, 1 - w), 0.2).mean())
    # four candidates: tau 0 is DPO against the losers' mean log-probabilities; a large tau, against the worst
    policy, ref, rewards = -3 * torch.rand(6, 4, dtype=torch.float64), -3 * torch.rand(6, 4, dtype=torch.float64), torch.rand(6, 4, dtype=torch.float64)
    w, worst = rewards.argmax(1, keepdim=True), rewards.argmin(1, keepdim=True)
    lose = lambda x: (x.sum(1) - pick(x, w)) / 3  # noqa: E731
    even = dico_terms(policy, ref, rewards, 0.0).logits
    assert_float64_close(even, (pick(policy, w) - lose(policy)) - (pick(ref, w) - lose(ref)))
    sharp = dico_terms(policy, ref, rewards, 1e6).logits
    assert_float64_close(sharp, (pick(policy, w) - pick(policy, worst)) - (pick(ref, w) - pick(ref, worst)))


def small_model(arch: str) -> torch.nn.Module:
    """A dropout-free ``arch`` model whose beams end at several lengths (the transformer's: one never ends)."""
    torch.manual_seed(0)
    options = {"fc": {"embed_size": 16, "hidden_size": 32, "dropout": 0.0},
               "transformer": {"num_layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "dropout": 0.0,
                               "feat_dropout": 0.0, "max_positions": 9}}[arch]
    model = build_model(arch, options, 12, 8, 4)
    for name, p in model.named_parameters():
        if name.endswith("bias") and p.shape[0] == 12:
            with torch.no_grad():
                p[0] += {"fc": 0.0, "transformer": 1.5}[arch]
    return model


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "transformer"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_candidates_are_the_beams_and_their_log_probabilities_the_searchs(arch: str, mode: str) -> None:
    model = to_float64(small_model(arch))
    torch.manual_seed(3)
    pooled, regions = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    batch = dataclasses.make_dataclass("B", ["pooled", "regions", "image_ids"])(pooled, regions, [0, 1, 2])
    env = dataclasses.replace(setup()[2], max_length=8)
    objective = build_objective("dico", {**DICO, "candidates": 4, "candidate_mode": mode}, env, model)
    objective.begin(model)
    tokens = objective.draw(model, batch)
    assert model.training
    with torch.no_grad():
        beams, scores = decoding.beam_search(model.eval(), model.encode(pooled, regions), 4, 8)
    assert torch.equal(tokens, beams.reshape(12, 8))
    assert len(set((tokens > 0).sum(1).tolist())) > 2  # beams of several lengths (a mask error would show)
    policy = objective.sequence_logprobs(model, batch, tokens)
    assert policy.requires_grad and model.training
    assert_float64_close(policy.detach(), scores)
    assert_float64_close(objective.sequence_logprobs(model, batch, tokens, reference=True), scores)


def test_a_multi_stage_model_is_refused() -> None:
    model = build_model("stackcap", {"embed_size": 8, "hidden_size": 8, "att_hidden_size": 8, "dropout": 0.0,
                                     "n_fine": 1}, len(WORDS), 5, 3)
    with pytest.raises(CaprlError, match="2 stages"):
        build_objective("dico", DICO, setup()[2], model)


@pytest.mark.parametrize("key, value", [("candidates", 1), ("beta", 0.0), ("tau", -1.0), ("candidate_mode", "greedy"),
                                        ("reward", 3)])
def test_bad_options_are_refused_naming_the_key(key: str, value: object) -> None:
    model, _, env = setup()
    with pytest.raises(CaprlError, match=key):
        build_objective("dico", {**DICO, key: value}, env, model, where="runs.x")


def test_the_reference_is_the_start_frozen_checkpointed_and_restored(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = {"embed_size": 8, "hidden_size": 16, "dropout": 0.1}
    model = build_model("fc", config, len(WORDS), 5, 3)
    env = setup()[2]
    objective = build_objective("dico", {**DICO, "lr": 1e-2, "tau": 1.0}, env, model)
    assert objective.turns == () and objective.keeps == ("reference",)
    with torch.no_grad():  # the run's init, loaded after the objective was built: begin takes it
        for p in model.parameters():
            p.add_(0.1)
    objective.begin(model)
    start = snapshot(model)
    assert same(objective.reference, start) and not any(p.requires_grad for p in objective.reference.parameters())
    trainer = toy_trainer(objective, model, tmp_path, epochs=1, init={"model": "xe"})
    fit(trainer)
    assert len(trainer.pos.history[-1]["step_losses"]) == 2  # 16 train images, 8 a batch: one update per batch
    assert not same(model, start) and same(objective.reference, start)
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert "reference" in saved["modules"]
    fresh = build_model("fc", config, len(WORDS), 5, 3)
    other = build_objective("dico", DICO, env, fresh)
    other.begin(fresh)  # a fresh start's reference, overwritten by the resume
    assert not same(other.reference, start)
    assert toy_trainer(other, fresh, tmp_path, epochs=1).resume() and same(other.reference, start)


def test_dico_learns_the_toy_reward() -> None:
    model, batch, env = setup()
    env = dataclasses.replace(env, reward=lambda name: count_red)
    objective = build_objective("dico", {**DICO, "candidates": 4, "beta": 0.5, "tau": 1.0}, env, model)
    objective.begin(model)
    rewards, stats = reward_trace(objective, model, batch, 40, "reward_mean", torch.optim.Adam(model.parameters(), lr=1e-2))
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.5
    assert stats["implicit_accuracy"] > 0.5 and stats["implicit_margin"] > 0
