"""PG-SPIDEr: Q by hand with a stub reward, roll-outs continue their prefix, the baseline learns only from its MSE."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from caprl import decoding
from caprl.decoding import Noise
from caprl.models import build_model, timeshared
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.objectives.pg_spider import monte_carlo_q
from toy import CONSTANT_LR, WORDS, count_red, decode, reward_trace

OPTIONS = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "rollouts": 3, "reward": "count_red", "baseline_lr": 1e-2, "baseline_hidden": 8,
           "baseline_warmup_steps": 0, "n_samples": 1, "rollout_mode": "policy"}


def setup(arch: str = "fc", n_images: int = 3):
    torch.manual_seed(0)
    sizes = {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}
    if arch != "fc":
        sizes["att_hidden_size"] = 8
    model = build_model(arch, sizes, len(WORDS), 5, 4)
    gen = torch.Generator().manual_seed(0)
    batch = Batch(image_ids=list(range(n_images)), pooled=torch.randn(n_images, 5, generator=gen),
                  regions=torch.randn(n_images, 4, 5, generator=gen), labels=torch.tensor([[1, 2, 3, 0]] * n_images),
                  label_image=torch.arange(n_images))
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    return model, batch, env


def test_q_on_a_hand_worked_example() -> None:
    """Image 0 said "a red": at step 1 the roll-outs say red 1, 0, 2 times -> Q = 1."""
    completions = [
        [  # image 0, prefix "a" then "a red"; step 2 is the end token (all three the same caption)
            [["a", "red"], ["a", "blue"], ["a", "red", "red"]],
            [["a", "red"], ["a", "red", "red"], ["a", "red", "square"]],
            [["a", "red"]] * 3,
        ],
        [  # image 1: a one-word caption; steps 1, 2 are past its end (masked, never scored)
            [["red"]] * 3,
            [["never", "scored"]] * 3,
            [["never", "scored"]] * 3,
        ],
    ]
    calls: list[int] = []

    def reward(ids, caps):
        calls.append(len(caps))
        return count_red(ids, caps)

    mask = np.array([[1, 1, 1], [1, 0, 0]], dtype=bool)
    q = monte_carlo_q(reward, [10, 11], completions, mask)
    np.testing.assert_allclose(q, [[1.0, (1 + 2 + 1) / 3, 1.0], [1.0, 0.0, 0.0]])
    assert calls == [5]  # 4 + 1 unique (image, caption) pairs only: one reward call for the batch


def test_rollouts_continue_exactly_their_prefix() -> None:
    """Each completion starts with the sampled prefix, and a greedy continuation from the
    state after t words equals the greedy choice given that prefix by teacher forcing."""
    model, batch, _ = setup("topdown")
    model.eval()
    with torch.no_grad():
        ctx = model.encode(batch.pooled, batch.regions)
        samples = decoding.rollout(model, decoding.start(model, ctx), 6, keep_states=True)
        completed = decoding.rollouts_from_prefixes(model, samples, 2, 6)
        steps = len(samples.after)
        assert completed.shape == (3, steps, 2, 1, 6)
        for t in range(steps):
            assert torch.equal(completed[:, t, :, 0, : t + 1], samples.tokens[:, None, 0, : t + 1].expand(-1, 2, -1))
        t = 1
        cont = decoding.rollout(model, samples.after[t], 6 - t - 1, greedy=True).tokens[:, 0]
        full = torch.cat([samples.tokens[:, 0, : t + 1], cont], dim=1)
        logprobs = model.teacher_forcing(ctx, full)[:, 0]  # position p predicts full[:, p]
        for i in range(3):
            if samples.tokens[i, 0, t] == 0:
                continue  # the prefix already ended: nothing to continue
            for p in range(t + 1, 6):
                if full[i, p - 1] == 0:
                    break
                assert full[i, p] == logprobs[i, p].argmax(), (i, p)


@pytest.mark.numerics
def test_baseline_gets_gradients_only_from_its_mse() -> None:
    model, batch, env = setup()
    objective = build_objective("pg_spider", OPTIONS, env, model)
    torch.manual_seed(3)
    loss, metrics = objective.loss(model, batch)
    loss.backward()
    baseline_grads = [p.grad.clone() for p in objective.baseline.parameters()]
    assert all(g is not None for g in baseline_grads) and any(g.abs().sum() > 0 for g in baseline_grads)
    assert "baseline_mse" in metrics and metrics["baseline_mse"] >= 0

    # recompute the baseline loss alone: the same gradients reach the baseline
    model.zero_grad()
    objective.zero_grad()
    torch.manual_seed(3)
    ctx = model.encode(batch.pooled, batch.regions)
    samples = decoding.rollout(model, decoding.start(model, ctx), 6, keep_hidden=True, keep_states=True)
    q = objective.q_values(model, samples, batch)
    steps = len(samples.after)
    b = objective.baseline(samples.hidden[:, -1].detach()).squeeze(-1)
    objective.mean((q - b) ** 2, samples.mask[:, -1, :steps]).backward()
    for expected, got in zip(baseline_grads, [p.grad for p in objective.baseline.parameters()]):
        assert torch.equal(got, expected)  # bit-identical: the same rollout and MSE, the same kernels and shapes
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.parameters()), "the MSE reached the RNN"


def test_pg_spider_raises_the_reward() -> None:
    model, batch, env = setup()
    objective = build_objective("pg_spider", {**OPTIONS, "lr": 1e-2}, env, model)
    rewards, _ = reward_trace(objective, model, batch, 40, "reward_sample", torch.optim.Adam(objective.param_groups(model)))
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.5


def test_pg_spider_options_are_typed() -> None:
    from caprl.errors import CaprlError

    model, _, env = setup()
    with pytest.raises(CaprlError, match=r"runs.x.options.rollouts: expected int"):
        build_objective("pg_spider", {**OPTIONS, "rollouts": "three"}, env, model, where="runs.x")
    with pytest.raises(CaprlError, match="unknown option.*beta"):
        build_objective("pg_spider", {**OPTIONS, "beta": 1}, env, model, where="runs.x")


def _with_step(batch: Batch, step: int) -> Batch:
    return dataclasses.replace(batch, noise=Noise(seed=1, step=step, total=len(batch.image_ids)))


def test_warmup_fits_the_baseline_alone_then_the_policy_moves() -> None:
    """Algorithm 1 (Liu et al.): B_phi is fitted on MC estimates of Q before the first policy
    update. In the first ``baseline_warmup_steps`` steps (the trainer's step, so a resumed run
    agrees) the caption model gets no gradient and the baseline does; from then on both."""
    model, batch, env = setup()
    objective = build_objective("pg_spider", {**OPTIONS, "baseline_warmup_steps": 2}, env, model)
    for step, policy_moves in ((0, False), (1, False), (2, True), (7, True)):
        model.zero_grad()
        objective.zero_grad()
        loss, metrics = objective.loss(model, _with_step(batch, step))
        loss.backward()
        model_grad = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)
        assert (model_grad > 0) == policy_moves, (step, model_grad)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in objective.baseline.parameters())
        assert metrics["baseline_mse"] >= 0 and "policy_loss" in metrics
        if not policy_moves:  # the loss is the baseline's MSE alone
            assert float(loss.detach()) == pytest.approx(metrics["baseline_mse"])


def test_warmup_steps_leave_no_taped_use_of_the_caption_model_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    """At COCO sizes the decode's layers are taped (:mod:`caprl.models.timeshared`); a warm-up step
    whose loss does not reach the decode must not record uses (the trainer's check would stop the
    run), so the warm-up decodes without gradient; after it the policy's backward reaches them all."""
    monkeypatch.setattr(timeshared, "MIN_TAPED", 0)  # tape these tiny layers as the COCO-sized ones are
    model, batch, env = setup()
    objective = build_objective("pg_spider", {**OPTIONS, "baseline_warmup_steps": 1}, env, model)
    for step in (0, 1):
        timeshared.reset(model)
        loss, _ = objective.loss(model, _with_step(batch, step))
        loss.backward()
        timeshared.check(model)


def test_q_weighted_gradient_matches_reinforce_in_expectation() -> None:
    """Eq. (Q_theta estimated by K roll-outs) is unbiased: over many noise draws, the gradient of
    sum_t Q(g_{1:t}) log pi(g_t) agrees in direction and size with REINFORCE's sum_t R log pi(g_t)
    (the same policy, whole-caption reward); a wrong prefix/roll-out alignment or a Q on the
    wrong step breaks both."""
    model, batch, env = setup("fc", n_images=4)
    objective = build_objective("pg_spider", OPTIONS, env, model)
    params = list(model.parameters())

    def flat() -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in params])

    def q_weighted(step: int) -> torch.Tensor:
        model.zero_grad()
        b = _with_step(batch, step)
        ctx = model.encode(b.pooled, b.regions)
        s = decoding.rollout(model, decoding.start(model, ctx), env.max_length, noise=b.noise, keep_hidden=True,
                             keep_states=True)
        steps = len(s.after)
        q = objective.q_values(model, s, b)
        (-(q * s.logprobs[:, -1, :steps] * s.mask[:, -1, :steps]).sum()).backward()
        return flat()

    def reinforce(step: int) -> torch.Tensor:
        model.zero_grad()
        b = dataclasses.replace(batch, noise=Noise(seed=2, step=step, total=4))
        s = decoding.sample(model, model.encode(b.pooled, b.regions), env.max_length, noise=b.noise)
        r = torch.tensor(count_red(b.image_ids, env.decode_words(s.tokens[:, -1])), dtype=torch.float32)
        (-(r[:, None] * s.logprobs[:, -1] * s.mask[:, -1]).sum()).backward()
        return flat()

    pg = torch.stack([q_weighted(i) for i in range(150)]).mean(0)
    rf = torch.stack([reinforce(i) for i in range(150)]).mean(0)
    assert float(pg @ rf / pg.norm() / rf.norm()) > 0.9
    assert 0.75 < float(pg.norm() / rf.norm()) < 1.33


@pytest.mark.parametrize("mode, training", [("policy", True), ("eval", False)])
def test_rollouts_come_from_the_policy_that_sampled(mode: str, training: bool) -> None:
    """Q_theta is an expectation under pi_theta, the policy whose sample is weighed: by default
    the roll-outs run in train mode like the sample (dropout on); ``rollout_mode: eval`` runs them
    without dropout (caprl's former behaviour, an option)."""
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.3}, len(WORDS), 5, 4)
    _, batch, env = setup()
    objective = build_objective("pg_spider", {**OPTIONS, "rollout_mode": mode}, env, model)
    seen: list[tuple[int, bool]] = []
    model.dropout.register_forward_pre_hook(lambda module, args: seen.append((args[0].shape[0], module.training)))
    model.train()
    ctx = model.encode(batch.pooled, batch.regions)
    samples = decoding.rollout(model, decoding.start(model, ctx), 6, keep_hidden=True, keep_states=True)
    sampled = len(seen)
    assert sampled > 0 and all(t for _, t in seen)  # the sample: train mode
    objective.q_values(model, samples, batch)
    rollout_calls = seen[sampled:]
    assert rollout_calls and all(t == training for _, t in rollout_calls)
    assert model.training  # left as it was


def test_m_samples_per_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """``n_samples`` = M captions per image (paper 001: M = 1); each is rolled out and scored
    against its own image's references, and the policy loss averages over all M x N captions."""
    model, batch, env = setup(n_images=2)
    starts: list[int] = []
    real_start = decoding.start
    monkeypatch.setattr(decoding, "start", lambda m, c, n=1: (starts.append(n), real_start(m, c, n))[1])
    scored: list[int] = []
    env = ObjectiveEnv(decode_words=decode, max_length=6,
                       reward=lambda name: lambda ids, caps: (scored.extend(ids), count_red(ids, caps))[1])
    objective = build_objective("pg_spider", {**OPTIONS, "n_samples": 4}, env, model)
    torch.manual_seed(1)
    loss, metrics = objective.loss(model, _with_step(batch, 0))
    loss.backward()
    assert starts == [4]
    assert set(scored) == {0, 1} and scored.count(0) > 0 and scored.count(1) > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(Exception, match="n_samples"):
        build_objective("pg_spider", {**OPTIONS, "n_samples": 0}, env, model)
