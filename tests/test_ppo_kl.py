"""PPO-KL (caprl.objectives.ppo_kl): the KL-penalised rewards, GAE, whitening, the clipped policy and
value losses and the adaptive KL controller against hand computations; re-scoring reproduces the
sampling's log-probabilities and decoder states; noptepochs updates on one batch; the reference
and the controller's coefficient are checkpointed and resumed; it learns the toy reward."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import caprl.objectives.ppo_kl  # noqa: F401  (registers ppo_kl)
from caprl import decoding
from caprl.errors import CaprlError
from caprl.models import build_model
from caprl.objectives import build_objective
from caprl.objectives.policy import Rollout, caption_logprobs
from caprl.objectives.ppo_kl import (AdaptiveKLController, KLController, controller_name, gae, kl_rewards, rescore,
                                     whiten)
from numerics import assert_float64_close, to_float64
from test_objectives import setup
from toy import (CONSTANT_LR, WORDS, count_red, decode, fit, rescoring_case, reward_trace, same, snapshot,
                 toy_trainer)

PPO = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "count_red", "kl_coef": 0.2,
       "kl_target": 0.0, "kl_horizon": 10000, "noptepochs": 1, "cliprange": 0.2,
       "cliprange_value": 0.2, "vf_coef": 0.1, "gamma": 1.0, "lam": 0.95, "whiten_rewards": True}
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def hand_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        length = int(mask[i].sum())
        for t in range(length):
            total = 0.0
            for s in range(t, length):
                following = float(values[i, s + 1]) if s + 1 < length else 0.0
                delta = float(rewards[i, s]) + gamma * following - float(values[i, s])
                total += (gamma * lam) ** (s - t) * delta
            out[i, t] = total
    return out


def test_kl_penalised_rewards_match_a_hand_computation() -> None:
    kl = torch.tensor([[0.5, -0.2, 0.1, 9.0], [0.3, 0.4, 9.0, 9.0], [0.0, 1.0, -1.0, 2.0]], dtype=torch.float64)
    scores = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    expected = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(3):
        length = int(MASK[i].sum())
        for t in range(length):
            expected[i, t] = -0.15 * float(kl[i, t]) + (float(scores[i]) if t == length - 1 else 0.0)
    assert_float64_close(kl_rewards(scores, kl, MASK.double(), 0.15), expected)


@pytest.mark.numerics
def test_the_rollout_penalises_each_token_by_its_k1_to_the_reference() -> None:
    """No whitening: returns = values + GAE of the hand rewards -kl_coef (log pi_old - log pi_ref)
    per token, plus the caption's count of 'red' at its end; the values read the decoder states."""
    model, batch, env = setup()
    model, batch = to_float64(model, batch)
    objective = to_float64(build_objective("ppo_kl", {**PPO, "whiten_rewards": False}, env, model))
    with torch.no_grad():  # a reference away from the policy (a KL term that is not 0), values not 0
        for p in [*objective.reference.parameters(), *objective.value_head.parameters()]:
            p.add_(0.1 * torch.randn_like(p))
    torch.manual_seed(1)
    rollout = objective.rollout(model, batch)
    tokens, mask = rollout.samples.last_stage(), rollout.mask
    ref = caption_logprobs(objective.reference.eval(), batch, tokens, 4)
    kl = (rollout.old_logprobs - ref) * mask
    assert float(kl.abs().max()) > 1e-2
    scores = torch.tensor(count_red(None, decode(tokens)), dtype=torch.float64)
    rewards = torch.zeros_like(kl)
    for i in range(len(tokens)):
        length = int(mask[i].sum())
        for t in range(length):
            rewards[i, t] = -0.2 * kl[i, t] + (scores[i] if t == length - 1 else 0.0)
    with torch.no_grad():  # dropout 0: the sampling's states
        values = objective.value_head(rescore(model.eval(), batch, tokens, 4)[1]) * mask
    assert_float64_close(rollout.extra["values"], values)
    advantages = hand_gae(rewards, values, mask, 1.0, 0.95)
    assert_float64_close(rollout.extra["returns"], advantages + values)
    assert_float64_close(rollout.extra["advantages"], whiten(advantages, mask))  # whitened (their mean shifted)
    per_caption = kl.sum(1)
    assert rollout.extra["stats"]["kl"] == pytest.approx(float(per_caption.mean()), rel=1e-12)


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5)])
def test_gae_matches_a_hand_loop(gamma: float, lam: float) -> None:
    torch.manual_seed(0)
    mask = MASK.double()  # float64: the hand loop adds in another order
    rewards, values = torch.randn(3, 4, dtype=torch.float64) * mask, torch.randn(3, 4, dtype=torch.float64) * mask
    assert_float64_close(gae(rewards, values, gamma, lam) * mask, hand_gae(rewards, values, mask, gamma, lam))


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whitening_is_over_the_caption_tokens(shift_mean: bool) -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0], [4.0, 0.0, 70.0, 80.0], [1.0, 1.0, 2.0, 6.0]], dtype=torch.float64)
    mask = MASK.double()  # float64: numpy's moments add in another order
    live = values[MASK.bool()].numpy()
    mean, var = live.mean(), live.var()  # biased, as tf.nn.moments
    expected = (values - mean) / np.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)
    out = whiten(values, mask, shift_mean=shift_mean)
    assert_float64_close(out, expected * mask)
    two_processes = lambda x: 2 * x  # each holding the same rows: the same statistics  # noqa: E731
    assert_float64_close(whiten(values, mask, shift_mean, two_processes), out)


def test_the_clipped_policy_and_value_losses_match_a_hand_computation() -> None:
    model, _, env = setup()
    objective = build_objective("ppo_kl", {**PPO, "vf_coef": 0.3}, env, model)
    mask = MASK[:2]
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.0, 0.0, 0.0]])
    new = old + torch.tensor([[0.5, -0.5, 0.01, 0.0], [0.1, 0.3, 0.0, 0.0]])  # ratios e^.5, e^-.5, ~1; e^.1, e^.3
    adv = torch.tensor([[1.5, -2.0, 0.7, 0.0], [-1.0, 0.4, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.5, -0.3, 0.0], [1.0, 0.0, 0.0, 0.0]])
    vpred = values + torch.tensor([[0.5, -0.1, -0.25, 0.0], [0.05, -0.4, 0.0, 0.0]])
    returns = torch.tensor([[1.0, -0.2, 0.1, 0.0], [0.8, 0.9, 0.0, 0.0]])
    rollout = Rollout(None, None, old, mask, {"advantages": adv, "values": values, "returns": returns, "stats": {}})
    loss, stats = objective.ppo_loss(rollout, new, vpred)
    pg, vf, clipped = [], [], []
    for i, t in zip(*torch.nonzero(mask, as_tuple=True)):
        r, a = float(torch.exp(new[i, t] - old[i, t])), float(adv[i, t])
        pg.append(max(-a * r, -a * min(max(r, 0.8), 1.2)))
        clipped.append(-a * min(max(r, 0.8), 1.2) > -a * r)
        v, old_v, ret = float(vpred[i, t]), float(values[i, t]), float(returns[i, t])
        vf.append(0.5 * max((v - ret) ** 2, (min(max(v, old_v - 0.2), old_v + 0.2) - ret) ** 2))
    assert 0 < sum(clipped) < len(clipped)  # both branches taken
    assert float(loss) == pytest.approx(np.mean(pg) + 0.3 * np.mean(vf), rel=1e-6)
    assert stats["value_loss"] == pytest.approx(np.mean(vf), rel=1e-6)
    assert stats["clip_ratio"] == pytest.approx(np.mean(clipped))


def test_the_adaptive_controller_follows_the_formula_and_the_fixed_one_stays() -> None:
    assert (controller_name(0.0), controller_name(6.0)) == ("fixed", "adaptive")
    for current, error in ((7.0, 7 / 6 - 1), (20.0, 0.2), (1.0, -0.2)):
        controller = AdaptiveKLController(0.15, 6.0, 10000)
        controller.update(current, 64)
        assert controller.value == pytest.approx(0.15 * (1 + error * 64 / 10000), rel=1e-12)
    fixed = KLController(0.15, 6.0, 10000)
    fixed.update(20.0, 64)
    assert fixed.value == 0.15


def test_the_rollout_updates_the_controller_once_with_its_mean_kl_and_caption_count() -> None:
    model, batch, env = setup()
    objective = build_objective("ppo_kl", {**PPO, "kl_target": 0.5, "kl_horizon": 100}, env, model)
    with torch.no_grad():
        for p in objective.reference.parameters():
            p.add_(0.3 * torch.randn_like(p))
    torch.manual_seed(2)
    _, stats = objective.loss(model, batch)
    error = float(np.clip(stats["kl"] / 0.5 - 1, -0.2, 0.2))
    assert stats["kl_coef"] == 0.2 and error != 0
    assert objective.kl_controller.value == pytest.approx(0.2 * (1 + error * 16 / 100), rel=1e-9)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "transformer"])
def test_rescoring_gives_the_sampling_log_probabilities_and_decoder_states(arch: str) -> None:
    model, batch = rescoring_case(arch)
    with torch.no_grad():
        samples = decoding.sample(model, model.encode(batch.pooled, batch.regions), 8, n=4, keep_hidden=True)
        logprobs, hidden = rescore(model, batch, samples.last_stage(), 4)
    mask = samples.mask[:, -1]
    assert 0 < mask.sum() < mask.numel()  # captions end at different steps
    steps = samples.hidden.shape[2]
    assert_float64_close(logprobs * mask, samples.logprobs[:, -1] * mask)
    assert_float64_close(hidden[:, :steps] * mask[:, :steps, None], samples.hidden[:, -1] * mask[:, :steps, None])


def test_a_multi_stage_model_is_refused() -> None:
    model = build_model("stackcap", {"embed_size": 8, "hidden_size": 8, "att_hidden_size": 8, "dropout": 0.0,
                                     "n_fine": 1}, len(WORDS), 5, 3)
    with pytest.raises(CaprlError, match="2 stages"):
        build_objective("ppo_kl", PPO, setup()[2], model)


@pytest.mark.parametrize("key, value", [("n_samples", 0), ("noptepochs", 0), ("cliprange", 0.0),
                                        ("cliprange_value", -0.1), ("kl_coef", -1.0), ("kl_target", -1.0),
                                        ("kl_horizon", 0), ("vf_coef", -0.1), ("gamma", 1.5), ("lam", -0.1),
                                        ("whiten_rewards", 1)])
def test_bad_options_are_refused_naming_the_key(key: str, value: object) -> None:
    model, _, env = setup()
    with pytest.raises(CaprlError, match=key):
        build_objective("ppo_kl", {**PPO, key: value}, env, model, where="runs.x")


def test_it_declares_its_modules() -> None:
    model, _, env = setup()
    objective = build_objective("ppo_kl", PPO, env, model)
    assert sorted(objective.modules_to_save()) == sorted(type(objective).holds + objective.keeps) == \
        ["kl_controller", "reference", "value_head"]
    assert not list(objective.kl_controller.parameters())
    assert [g["name"] for g in objective.param_groups(model)] == ["model", "value_head"]
    with torch.no_grad():  # the run's init loaded after the objective was built: begin copies it
        for p in model.parameters():
            p.add_(1.0)
    objective.begin(model)
    assert same(objective.reference, snapshot(model))


def test_two_epochs_update_twice_on_one_batch_and_the_state_resumes(tmp_path: Path) -> None:
    """noptepochs 2: two optimiser steps per batch (turns pass1, pass2), the second re-scoring the
    same captions; the reference stays the start; the reference, the value head and the adaptive
    controller's coefficient are in the checkpoint and come back on resume."""
    torch.manual_seed(0)
    arch = {"embed_size": 8, "hidden_size": 16, "dropout": 0.1}
    model = build_model("fc", arch, len(WORDS), 5, 3)
    env = setup()[2]
    options = {**PPO, "noptepochs": 2, "lr": 1e-2, "kl_target": 1e-3, "kl_horizon": 50}
    objective = build_objective("ppo_kl", options, env, model)
    assert objective.turns == ("pass1", "pass2")
    objective.begin(model)
    start = snapshot(model)
    sampled, rescored = [], []
    real_rollout, real_rescore = objective.rollout, objective.rescore
    objective.rollout = lambda m, b: sampled.append(real_rollout(m, b)) or sampled[-1]  # type: ignore[method-assign]
    objective.rescore = lambda m, b, t, n: rescored.append(t) or real_rescore(m, b, t, n)  # type: ignore[method-assign]
    trainer = toy_trainer(objective, model, tmp_path, epochs=1, init={"model": "xe"})
    fit(trainer)
    assert len(sampled) == len(rescored) == 2  # 16 train images, 8 a batch: one sampling per batch
    assert all(torch.equal(r.samples.last_stage(), t) for r, t in zip(sampled, rescored))
    assert {int(s["step"]) for s in trainer.optimizer.state.values()} == {4}  # 2 batches x 2 updates
    assert not same(model, start) and same(objective.reference, start)
    coef, head = objective.kl_controller.value, snapshot(objective.value_head)
    assert coef != 0.2 and float(objective.value_head.linear.weight.detach().abs().max()) > 0
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert {"reference", "value_head", "kl_controller"} <= set(saved["modules"])
    fresh = build_model("fc", arch, len(WORDS), 5, 3)
    other = build_objective("ppo_kl", options, env, fresh)
    other.begin(fresh)  # a fresh start's reference and coefficient, overwritten by the resume
    assert not same(other.reference, start) and other.kl_controller.value == 0.2
    assert toy_trainer(other, fresh, tmp_path, epochs=1).resume()
    assert same(other.reference, start) and same(other.value_head, head) and other.kl_controller.value == coef


def test_ppo_kl_learns_the_toy_reward() -> None:
    model, batch, env = setup()
    env = dataclasses.replace(env, reward=lambda name: count_red)
    objective = build_objective("ppo_kl", {**PPO, "noptepochs": 2, "kl_coef": 0.05}, env, model)
    objective.begin(model)
    rewards, _ = reward_trace(objective, model, batch, 40, "reward_sample",
                              torch.optim.Adam(objective.param_groups(model), lr=1e-2))
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.5


def test_the_value_loss_reaches_the_decoder_as_the_shared_trunk_of_the_reference() -> None:
    model, batch, env = setup()
    grads = []
    for vf_coef in (0.0, 1.0):
        objective = build_objective("ppo_kl", {**PPO, "vf_coef": vf_coef}, env, model)
        torch.manual_seed(4)
        torch.nn.init.normal_(objective.value_head.linear.weight)  # zero-initialised: no gradient to pass on
        loss, _ = objective.loss(model, batch)
        model.zero_grad()
        loss.backward()
        grads.append(torch.cat([q.grad.flatten() for q in model.lstm.parameters()]))
    assert not torch.allclose(grads[0], grads[1])
