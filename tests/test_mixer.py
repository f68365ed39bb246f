"""MIXER (Ranzato et al. 2016): the M schedule, XE on the first M gold words, REINFORCE with a
learned baseline on the sampled rest, the two ends (M >= length is XE, M = 0 is REINFORCE from
the start token), a training run, and the same step giving the same loss (resume)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from caprl import decoding
from caprl.decoding import Noise
from caprl.models import build_model
from caprl.models.base import map_batch
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.objectives.mixer import continues, schedule, xe_mask
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, WORDS, count_red, decode

MAX_LENGTH = 6
LABELS = [[1, 2, 3, 0, 0, 0], [1, 4, 5, 2, 0, 0],  # image 0: "a red circle", "a blue square red"
          [1, 2, 0, 0, 0, 0], [1, 4, 3, 2, 5, 0],  # image 1: 2 and 5 words
          [1, 2, 3, 4, 5, 2]]                      # image 2: 6 words (its end token at position 6)
OWNER = [0, 0, 1, 1, 2]
OPTIONS: dict[str, Any] = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "reward": "count_red", "n_samples": 1, "m_start": 2,
                           "m_step": 0, "epochs_per_stage": 1, "baseline_lr": 1e-2, "baseline_hidden": 0}


def setup(steps_per_epoch: int = 1, seed: int = 5, step: int = 0):
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), 5, 3)
    gen = torch.Generator().manual_seed(0)
    batch = Batch(image_ids=[10, 11, 12], pooled=torch.randn(3, 5, generator=gen),
                  regions=torch.randn(3, 3, 5, generator=gen), labels=torch.tensor(LABELS),
                  label_image=torch.tensor(OWNER), noise=Noise(seed, step, total=3))
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=MAX_LENGTH,
                       extras={"steps_per_epoch": steps_per_epoch})
    return model, batch, env


def mixer(env: ObjectiveEnv, model: Any, **options: Any) -> Any:
    return build_objective("mixer", {**OPTIONS, **options}, env, model)


def gold_rows_ctx(model: Any, batch: Batch) -> Any:
    return map_batch(lambda t: t.index_select(0, batch.label_image), model.encode(batch.pooled, batch.regions))


def test_m_is_a_pure_function_of_the_epoch_from_the_trainers_step() -> None:
    assert [schedule(e, 8, 2, 1) for e in range(7)] == [8, 6, 4, 2, 0, 0, 0]
    assert [schedule(e, 5, 2, 2) for e in range(8)] == [5, 5, 3, 3, 1, 1, 0, 0]
    assert [schedule(e, 4, 0, 1) for e in range(3)] == [4, 4, 4]  # m_step 0: M fixed
    model, batch, env = setup(steps_per_epoch=3)
    objective = mixer(env, model, m_start=6, m_step=2, epochs_per_stage=2)
    got = []
    for step in [13, 0, 5, 6, 11, 12, 30, 2]:  # any order: nothing but the step counts
        batch.noise = Noise(5, step, total=3)
        got.append(objective.m_at(batch))
    assert got == [2, 6, 6, 4, 4, 2, 0, 6]  # epoch = step // 3, stage = epoch // 2
    batch.noise = Noise(5, 6, total=3)
    assert objective.loss(model, batch)[1]["mixer_m"] == 4.0


@pytest.mark.numerics
def test_xe_part_is_xes_loss_on_the_prefix_positions() -> None:
    """Positions t < M of every caption (all of a caption of at most M words, its end token
    included) are XE on the gold words: the same log-probabilities as ``xe``'s teacher forcing."""
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the mixed decode's gold steps against a teacher-forced forward
    mask = xe_mask(batch.labels, 2, MAX_LENGTH + 1)
    expected_mask = torch.zeros(5, MAX_LENGTH + 1)
    expected_mask[[0, 1, 3, 4], :2] = 1  # longer than 2 words: positions 0, 1
    expected_mask[2, :3] = 1  # "a red": 2 words and its end token
    assert torch.equal(mask, expected_mask)
    assert continues(batch.labels, 2).tolist() == [True, True, False, True, True]
    objective = to_float64(mixer(env, model))
    mixed = objective.decode(model, batch, 2)
    gold = model.token_logprobs(gold_rows_ctx(model, batch), batch.labels)[:, -1]  # [R, T+1], xe's
    positions = mixed.gold_logprobs.shape[1]
    assert_float64_close(mixed.gold_logprobs * mixed.gold_mask, gold[:, :positions] * mixed.gold_mask)
    _, stats = objective.mixed_loss(mixed, batch)
    xe_prefix = (-gold.detach() * expected_mask).sum() / expected_mask.sum()
    assert_float64_close(stats["xe"], xe_prefix)


def test_reinforce_reaches_only_the_sampled_positions_from_m_on() -> None:
    """The loss's gradient on the gold log-probabilities is the XE mask (none at positions >= M),
    the sampled tokens continue each gold prefix of M words at position M, and only the sampled
    tokens of the continuing captions get a REINFORCE gradient."""
    model, batch, env = setup()
    objective = mixer(env, model, n_samples=2)
    m = 2
    mixed = objective.decode(model, batch, m)
    loss, _ = objective.mixed_loss(mixed, batch)
    samples = mixed.samples
    gold_grad, sample_grad = torch.autograd.grad(loss, [mixed.gold_logprobs, samples.logprobs])
    assert torch.equal(gold_grad != 0, mixed.gold_mask > 0)
    going = continues(batch.labels, m)
    assert not bool(gold_grad[going, m:].any())  # a continuing caption: no gold token from M on
    assert bool(gold_grad[~going, m:].all())  # "a red" (2 words): its end token, at M, is XE
    live = samples.mask[:, 0] > 0
    assert torch.equal(sample_grad[:, 0] != 0, live)
    assert live.any(dim=1).tolist() == [True, True, True, True, False, False, True, True, True, True]  # 2 per caption
    prefixes = [decode(batch.labels[i:i + 1, :m])[0] for i in (0, 0, 1, 1, 3, 3, 4, 4)]
    assert [c[:m] for c in mixed.captions] == prefixes  # gold prefix, then the model's words
    assert all(len(c) <= MAX_LENGTH for c in mixed.captions)


@pytest.mark.numerics
def test_m_at_least_every_caption_length_is_xe() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # MIXER's XE part against xe's loss: other forwards, other sums
    xe_loss, _ = build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR}, env, model).loss(model, batch)
    loss, stats = to_float64(mixer(env, model, m_start=6)).loss(model, batch)  # the longest caption has 6 words
    assert_float64_close(loss, xe_loss)
    assert "reinforce" not in stats
    loss5, stats5 = to_float64(mixer(env, model, m_start=5)).loss(model, batch)  # the 6-word caption samples its end
    assert "reinforce" in stats5 and not torch.isclose(loss5, xe_loss, atol=1e-6)


@pytest.mark.numerics
def test_m_zero_is_reinforce_from_the_start_token_with_the_learned_baseline() -> None:
    """M = 0: one sample per gold caption from the start token (the step's noise over the caption
    rows), -(r - b_t) log p per sampled token, b_t a linear regressor on the detached hidden
    state trained by MSE: its gradient never reaches the RNN."""
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's decode and sums against a hand rollout's
    objective = to_float64(mixer(env, model, m_start=0))
    assert isinstance(objective.baseline, nn.Linear)
    loss, stats = objective.loss(model, batch)
    model.zero_grad()
    objective.zero_grad()
    loss.backward()
    got_model = [p.grad.clone() for p in model.parameters()]
    got_baseline = [p.grad.clone() for p in objective.baseline.parameters()]

    model.zero_grad()
    objective.zero_grad()
    ctx = gold_rows_ctx(model, batch)
    samples = decoding.rollout(model, decoding.start(model, ctx), MAX_LENGTH, noise=Noise(5, 0, total=5),
                               keep_hidden=True)
    steps = samples.hidden.shape[2]
    r = torch.tensor(count_red(None, decode(samples.last_stage())), dtype=torch.float32)
    logp, mask = samples.logprobs[:, 0, :steps], samples.mask[:, 0, :steps]
    b = objective.baseline(samples.hidden[:, 0].detach()).squeeze(-1)
    policy = (-(r[:, None] - b).detach() * logp * mask).sum() / mask.sum()
    mse = (((r[:, None] - b) ** 2) * mask).sum() / mask.sum()
    assert_float64_close(loss, policy + mse)
    assert stats["reward_sample"] == pytest.approx(float(r.mean())) and stats["xe"] == 0.0
    policy.backward(retain_graph=True)
    for expected, got in zip([p.grad.clone() for p in model.parameters()], got_model):
        assert_float64_close(got, expected)  # the MSE adds nothing to the RNN's gradient
    model.zero_grad()
    mse.backward()
    for expected, got in zip([p.grad for p in objective.baseline.parameters()], got_baseline):
        assert_float64_close(got, expected)
    assert all(p.grad is None or not bool(p.grad.any()) for p in model.parameters())


def test_training_steps_raise_the_reward_and_train_the_baseline() -> None:
    model, batch, env = setup(steps_per_epoch=10)
    objective = mixer(env, model, lr=1e-2, m_start=1, m_step=1, epochs_per_stage=2)  # M = 1, then 0 from step 20
    optimizer = torch.optim.Adam(objective.param_groups(model))
    assert [g["name"] for g in objective.param_groups(model)] == ["model", "baseline"]
    assert set(objective.modules_to_save()) == {"baseline"}
    before = [p.detach().clone() for p in objective.baseline.parameters()]
    rewards, ms = [], []
    for step in range(40):
        batch.noise = Noise(5, step, total=3)
        loss, stats = objective.loss(model, batch)
        rewards.append(stats["reward_sample"])
        ms.append(stats["mixer_m"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert ms[:20] == [1.0] * 20 and ms[20:] == [0.0] * 20
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.5
    assert any(not torch.equal(a, b) for a, b in zip(before, objective.baseline.parameters()))


def test_the_same_step_gives_the_same_loss_whatever_came_before() -> None:
    """Resume-safe: M and the sampling noise depend on the step alone (no state carried over)."""
    model, batch, env = setup(steps_per_epoch=2)
    first = mixer(env, model, m_start=4, m_step=1)
    for step in range(3):  # a history the second objective never saw
        batch.noise = Noise(5, step, total=3)
        first.loss(model, batch)
    second = mixer(env, model, m_start=4, m_step=1)
    second.load_state_dict(first.state_dict())
    losses = []
    for objective in (first, second):
        batch.noise = Noise(5, 7, total=3)
        losses.append(objective.loss(model, batch))
    assert torch.equal(losses[0][0], losses[1][0]) and losses[0][1] == losses[1][1]
    assert losses[0][1]["mixer_m"] == 1.0  # epoch 3


def test_options_come_from_params_and_are_typed() -> None:
    from caprl.errors import CaprlError
    from conftest import default_params

    options = default_params()["objectives"]["mixer"]
    assert options["baseline_hidden"] == 0 and options["n_samples"] == 1 and options["reward"] == "cider_d"
    model, _, env = setup()
    assert isinstance(build_objective("mixer", {**OPTIONS, "baseline_hidden": 4}, env, model).baseline,
                      nn.Sequential)
    with pytest.raises(CaprlError, match=r"runs.x.options.m_step: expected int"):
        build_objective("mixer", {**OPTIONS, "m_step": 0.5}, env, model, where="runs.x")
    with pytest.raises(CaprlError, match="epochs_per_stage"):
        build_objective("mixer", {k: v for k, v in OPTIONS.items() if k != "epochs_per_stage"}, env, model)
