"""GRPO (caprl.objectives.grpo): the group advantage, the clipped ratio, the k3 KL and TRL's three
aggregations against hand computations; with one pass, no KL, no scaling and a token mean its
gradient is NSC's times (G - 1) / G on the same samples; re-scoring reproduces the sampling's
log-probabilities; later passes update on the same captions; the reference is the start, frozen,
checkpointed and restored."""

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
from caprl.objectives.grpo import group_advantages
from caprl.objectives.policy import Rollout, caption_logprobs, k3
from numerics import assert_float64_close, to_float64
from test_objectives import setup
from toy import CONSTANT_LR, WORDS, count_red, fit, rescoring_case, reward_trace, same, snapshot, toy_trainer

GRPO = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "count_red", "scale_rewards": "group",
        "loss_type": "grpo", "epsilon": 0.2, "epsilon_high": 0.2, "num_iterations": 1, "beta": 0.0}
NSC = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "count_red", "temperature": 1.0,
       "entropy": 0.0, "baseline": "nsc"}


def grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.numerics
def test_one_pass_without_kl_or_scaling_is_nsc_times_g_minus_one_over_g() -> None:
    """NSC's advantage r_i - mean of the others = G / (G - 1) (r_i - group mean): GRPO's with
    scale none, beta 0, one pass and bnpo's token mean (SCST's) is (G - 1) / G of NSC's gradient."""
    model, batch, env = setup(n_images=6)
    model, batch = to_float64(model, batch)
    g = GRPO["n_samples"]
    grpo = build_objective("grpo", {**GRPO, "scale_rewards": "none", "loss_type": "bnpo"}, env, model)
    nsc = build_objective("scst", NSC, env, model)
    torch.manual_seed(5)
    loss_grpo, stats = grpo.loss(model, batch)
    torch.manual_seed(5)
    loss_nsc, _ = nsc.loss(model, batch)
    assert stats["reward_sample"] > 0  # the toy reward varies within the groups: a real comparison
    ours, theirs = grads(model, loss_grpo), grads(model, loss_nsc)
    assert len(ours) == len(theirs) and any(bool(t.abs().max() > 1e-3) for t in theirs)
    for a, b in zip(ours, theirs):
        assert_float64_close(a, b * (g - 1) / g)


def test_group_advantage_scales_as_trl() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 0.0, 4.0], dtype=torch.float64)  # two images, four captions each
    centred = torch.tensor([-2.0, -1.0, 0.0, 3.0, -1.0, -1.0, -1.0, 3.0], dtype=torch.float64)
    assert torch.equal(group_advantages(rewards, 4, "none"), centred)
    std = torch.tensor([torch.tensor([1.0, 2, 3, 6], dtype=torch.float64).std(), torch.tensor([0.0, 0, 0, 4], dtype=torch.float64).std()], dtype=torch.float64)
    assert_float64_close(group_advantages(rewards, 4, "group"), centred / (std.repeat_interleave(4) + 1e-4))
    assert_float64_close(group_advantages(rewards, 4, "batch"), centred / (rewards.std() + 1e-4))
    assert torch.equal(group_advantages(torch.full((4,), 0.5), 4, "group"), torch.zeros(4))  # all equal: no signal


def test_k3_is_the_hand_formula_and_never_negative() -> None:
    lp, ref = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64), torch.tensor([-1.0, -1.5, -0.1], dtype=torch.float64)
    delta = [-1.0 - -1.0, -1.5 - -0.5, -0.1 - -2.0]  # ref - lp, in Python floats (float64)
    assert_float64_close(k3(lp, ref), torch.tensor([math.exp(d) - d - 1 for d in delta], dtype=torch.float64))
    assert (k3(torch.randn(100), torch.randn(100)) >= 0).all()


def hand_pass(model, env, loss_type: str, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The objective's pass loss on a made-up rollout, and the same loss written out by hand."""
    objective = build_objective("grpo", {**GRPO, "loss_type": loss_type, "beta": beta}, env, model)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)  # float64: the hand sums add in other orders
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.0, 0.0, 0.0]], dtype=torch.float64)
    new = old + torch.tensor([[0.5, -0.5, 0.01, 0.0], [0.1, 0.3, 0.0, 0.0]], dtype=torch.float64)  # ratios e^.5, e^-.5, ~1; e^.1, e^.3
    adv = torch.tensor([1.5, -2.0], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -1.0, -0.4, 0.0], [-0.5, -0.9, 0.0, 0.0]], dtype=torch.float64)
    rollout = Rollout(None, None, old, mask, {"advantages": adv, "ref_logprobs": ref, "reward_sample": 0.0})
    loss, _ = objective.pass_loss(rollout, new)
    per_token = torch.zeros_like(mask)
    for i in range(2):
        for t in range(4):
            r = float(torch.exp(new[i, t] - old[i, t]))
            clipped = min(max(r, 0.8), 1.2)
            value = -min(r * float(adv[i]), clipped * float(adv[i]))
            d = float(ref[i, t] - new[i, t])
            per_token[i, t] = value + beta * (math.exp(d) - d - 1)
    per_token = per_token * mask
    expected = {"grpo": (per_token.sum(1) / mask.sum(1)).mean(), "bnpo": per_token.sum() / mask.sum(),
                "dr_grpo": per_token.sum() / (2 * env.max_length)}[loss_type]
    return loss, expected


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_clipped_loss_and_its_aggregation_match_a_hand_computation(loss_type: str, beta: float) -> None:
    model, _, env = setup()
    loss, expected = hand_pass(model, env, loss_type, beta)
    assert_float64_close(loss, expected)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "topdown", "transformer"])
def test_rescoring_the_samples_gives_the_sampling_log_probabilities(arch: str) -> None:
    """A later pass's ratio is 1 until the policy moves: teacher-forcing the sampled captions
    reproduces the log-probabilities the sampling drew them with (every length, end token included)."""
    model, batch = rescoring_case(arch)
    with torch.no_grad():
        samples = decoding.sample(model, model.encode(batch.pooled, batch.regions), 8, n=4)
        again = caption_logprobs(model, batch, samples.last_stage(), 4)
    mask = samples.mask[:, -1]
    assert 0 < mask.sum() < mask.numel()  # captions end at different steps
    assert_float64_close(again * mask, samples.logprobs[:, -1] * mask)


def test_a_multi_stage_model_is_refused() -> None:
    model = build_model("stackcap", {"embed_size": 8, "hidden_size": 8, "att_hidden_size": 8, "dropout": 0.0,
                                     "n_fine": 1}, len(WORDS), 5, 3)
    _, _, env = setup()
    with pytest.raises(CaprlError, match="2 stages"):
        build_objective("grpo", GRPO, env, model)


@pytest.mark.parametrize("key, value", [("n_samples", 1), ("epsilon", 1.5), ("num_iterations", 0), ("beta", -1.0),
                                        ("loss_type", "dapo"), ("scale_rewards", "std")])
def test_bad_options_are_refused_naming_the_key(key: str, value: object) -> None:
    model, _, env = setup()
    with pytest.raises(CaprlError, match=key):
        build_objective("grpo", {**GRPO, key: value}, env, model, where="runs.x")


def test_two_passes_update_twice_on_one_batch_and_the_reference_stays_the_start(tmp_path: Path) -> None:
    """num_iterations 2: two optimiser steps per batch (the trainer's turns pass1, pass2), the
    second on the same captions; the reference (begin: the start) never moves, is in the checkpoint
    and comes back on resume."""
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.1}, len(WORDS), 5, 3)
    env = setup()[2]
    objective = build_objective("grpo", {**GRPO, "num_iterations": 2, "beta": 0.1, "lr": 1e-2}, env, model)
    assert objective.turns == ("pass1", "pass2")
    objective.begin(model)
    start = snapshot(model)
    assert same(objective.reference, start) and not any(p.requires_grad for p in objective.reference.parameters())
    sampled = []
    real = objective.rollout
    objective.rollout = lambda m, b: sampled.append(b) or real(m, b)  # type: ignore[method-assign]
    trainer = toy_trainer(objective, model, tmp_path, epochs=1, init={"model": "xe"})
    fit(trainer)
    assert len(sampled) == 2  # 16 train images, 8 a batch: one sampling per batch
    history = trainer.pos.history[-1]
    assert len(history["step_losses"]) == 2
    assert not same(model, start) and same(objective.reference, start)
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert "reference" in saved["modules"]
    fresh = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.1}, len(WORDS), 5, 3)
    other = build_objective("grpo", {**GRPO, "num_iterations": 2, "beta": 0.1}, env, fresh)
    other.begin(fresh)  # a fresh start's reference, overwritten by the resume
    assert not same(other.reference, start)
    assert toy_trainer(other, fresh, tmp_path, epochs=1).resume() and same(other.reference, start)


def test_without_kl_there_is_no_reference() -> None:
    model, _, env = setup()
    assert "reference" not in build_objective("grpo", GRPO, env, model).modules_to_save()


def test_grpo_learns_the_toy_reward() -> None:
    model, batch, env = setup()
    env = dataclasses.replace(env, reward=lambda name: count_red)
    objective = build_objective("grpo", {**GRPO, "lr": 1e-2, "beta": 0.04}, env, model)
    objective.begin(model)
    rewards, _ = reward_trace(objective, model, batch, 60, "reward_sample", torch.optim.Adam(model.parameters(), lr=1e-2))
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.5


@pytest.mark.parametrize("method, options", [("scst", NSC), ("grpo", GRPO)])
def test_remove_bad_endings_while_sampling(method: str, options: dict) -> None:
    """Option remove_bad_endings: no RL sample ends on a bad ending ('a' of the toy words), where
    without it many do; the objective needs the vocabulary's words to know them."""
    model, batch, env = setup(n_images=8)
    ends = {}
    for flag in (False, True):
        objective = build_objective(method, {**options, "remove_bad_endings": flag},
                                    dataclasses.replace(env, extras={"words": WORDS}), model)
        torch.manual_seed(1)
        _, samples = objective.greedy_and_samples(model, batch, 16, greedy=False)
        captions = [c for c in env.decode_words(samples.last_stage()) if c]
        ends[flag] = sum(c[-1] == "a" for c in captions)
    assert ends[False] > 0 and ends[True] == 0
    objective = build_objective(method, {**options, "remove_bad_endings": True}, env, model)
    with pytest.raises(CaprlError, match="words"):
        objective.greedy_and_samples(model, batch, 2, greedy=False)


def test_remove_bad_endings_with_several_grpo_passes_is_refused() -> None:
    model, _, env = setup()
    with pytest.raises(CaprlError, match="remove_bad_endings"):
        build_objective("grpo", {**GRPO, "num_iterations": 2, "remove_bad_endings": True}, env, model, where="runs.x")
