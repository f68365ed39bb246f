"""The coarse-to-fine RL objective (Stack-Cap eq. 11-15)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from caprl import decoding
from caprl.errors import CaprlError
from caprl.models import build_model
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.objectives.c2f import c2f_advantages
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, WORDS, count_red, decode, greedy_reward_gain


def length(image_ids, captions) -> np.ndarray:
    """Another: the caption's length (varies a lot between samples, so advantages are not zero)."""
    return np.array([len(c) for c in captions], dtype=np.float64)


REWARDS = {"count_red": count_red, "length": length}


def setup(arch: str = "stackcap", n_images: int = 4, dropout: float = 0.2):
    torch.manual_seed(0)
    model = build_model(arch, {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8, "dropout": dropout},
                        len(WORDS), 5, 4)
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([[1, 2, 3, 0], [1, 4, 5, 0]] * n_images)
    batch = Batch(image_ids=list(range(n_images)), pooled=torch.randn(n_images, 5, generator=gen),
                  regions=torch.randn(n_images, 4, 5, generator=gen), labels=labels,
                  label_image=torch.arange(n_images).repeat_interleave(2))
    env = ObjectiveEnv(decode_words=decode, reward=REWARDS.__getitem__, max_length=6)
    return model, batch, env


def test_advantages_by_hand() -> None:
    r_sample = np.array([[1.0, 0.0], [2.0, 1.0], [4.0, 0.0]])  # stages 0 (coarse), 1, 2; two samples
    r_greedy = np.array([[9.0, 9.0], [1.0, 1.0], [3.0, 2.0]])  # row 0 is not used
    # stage 1: (2-1)+(2-1) = 2, (1-1)+(1-0) = 1; stage 2: (4-3)+(4-2) = 3, (0-2)+(0-1) = -3
    assert c2f_advantages(r_sample, r_greedy).tolist() == [[2.0, 1.0], [3.0, -3.0]]
    with pytest.raises(ValueError):
        c2f_advantages(r_sample[:1], r_greedy[:1])  # no fine stage


@pytest.mark.numerics
def test_loss_equals_the_hand_computed_value() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's sums and the hand's loop add in other orders
    n = 3
    objective = build_objective("c2f", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": n, "reward": "length", "temperature": 1.0}, env, model)
    torch.manual_seed(11)
    loss, metrics = objective.loss(model, batch)
    # recompute with the same random stream: greedy in eval mode, samples in train mode
    torch.manual_seed(11)
    ctx = model.encode(batch.pooled, batch.regions)
    greedy = decoding.sample(model.eval(), ctx, 6, greedy=True)
    samples = decoding.sample(model.train(), ctx, 6, n=n)
    expected = torch.zeros(())
    for i in (1, 2):
        words_s, words_prev = decode(samples.tokens[:, i]), decode(samples.tokens[:, i - 1])
        words_g = decode(greedy.tokens[:, i])
        total, count = torch.zeros(()), 0.0
        for j in range(len(words_s)):  # row j is sample j % n of image j // n
            adv = (len(words_s[j]) - len(words_g[j // n])) + (len(words_s[j]) - len(words_prev[j]))
            for t in range(6):
                if samples.mask[j, i, t]:
                    total = total + adv * samples.logprobs[j, i, t]
                    count += 1
        expected = expected - total / count
    assert_float64_close(loss, expected)
    assert metrics["reward_sample"] == np.mean([len(w) for w in decode(samples.tokens[:, 2])])
    assert metrics["reward_greedy_stage0"] == np.mean([len(w) for w in decode(greedy.tokens[:, 0])])


@pytest.mark.parametrize("arch", ["stackcap", "stackcap_star"])
def test_gradients_reach_every_fine_stage_and_the_coarse_lstm_only_through_them(arch: str) -> None:
    model, batch, env = setup(arch, dropout=0.0)
    objective = build_objective("c2f", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "length", "temperature": 1.0}, env, model)
    torch.manual_seed(5)
    loss, _ = objective.loss(model, batch)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in grads.items():
        if name == "logits.0.weight" or name == "logits.0.bias":
            assert grad is None or grad.abs().sum() == 0, name  # no RL term for the coarse stage
        elif name != "embed.weight":
            assert grad is not None and grad.abs().sum() > 0, name
    for name in ("coarse.weight_ih", "coarse.weight_hh", "embed.weight"):
        assert grads[name].abs().sum() > 0  # theta_0 is trained through the fine stages


def test_coarse_stage_gets_no_gradient_from_its_own_samples() -> None:
    """With the fine stages cut off the coarse LSTM's states, the coarse LSTM gets no gradient at all."""
    model, batch, env = setup(dropout=0.0)
    coarse = model.coarse
    model.coarse = _Detached(coarse)
    objective = build_objective("c2f", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "length", "temperature": 1.0}, env, model)
    torch.manual_seed(5)
    loss, _ = objective.loss(model, batch)
    loss.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in coarse.parameters())
    assert model.fine[0].weight_ih.grad.abs().sum() > 0


class _Detached(torch.nn.Module):
    """An LSTM cell whose outputs carry no gradient back into it."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, state):
        h, c = self.inner(x, state)
        return h.detach(), c.detach()


def test_c2f_raises_the_fine_stages_reward() -> None:
    """C2F steps on the toy reward make the last stage's greedy caption say 'red' more."""
    model, batch, env = setup(dropout=0.0)
    objective = build_objective("c2f", {"lr": 1e-2, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "count_red", "temperature": 1.0}, env, model)
    first, last = greedy_reward_gain(objective, model, batch, steps=40)
    assert last > first + 1.0


def test_c2f_needs_a_multi_stage_model_and_known_options() -> None:
    model, batch, env = setup("stackcap")
    fc = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), 5, 4)
    objective = build_objective("c2f", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "reward": "length", "n_samples": 1, "temperature": 1.0}, env, model)
    with pytest.raises(CaprlError, match="multi-stage"):
        objective.loss(fc, batch)
    with pytest.raises(CaprlError, match="beta"):
        build_objective("c2f", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "beta": 2, "n_samples": 1, "reward": "cider_d", "temperature": 1.0}, env, model)


@pytest.mark.numerics
def test_a_batch_split_over_two_processes_gives_the_one_process_gradient() -> None:
    """DDP: two halves (shared sampling noise, global token counts, averaged gradients) = the whole batch."""
    from caprl.decoding import Noise

    model, batch, env = setup(dropout=0.0)
    model, batch = to_float64(model, batch)  # the halves' gradients averaged: other sums, compared in float64
    options = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 2, "reward": "length", "temperature": 1.0}
    counts: list[torch.Tensor] = []

    def record(x: torch.Tensor) -> torch.Tensor:
        counts.append(x)
        return x

    whole = Batch(batch.image_ids, batch.pooled, batch.regions, batch.labels, batch.label_image, Noise(3, 7, total=4))
    env_one = ObjectiveEnv(decode_words=decode, reward=REWARDS.__getitem__, max_length=6, global_sum=record)
    build_objective("c2f", options, env_one, model).loss(model, whole)[0].backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    grads = []
    for offset in (0, 2):
        replay = iter(counts)
        env_two = ObjectiveEnv(decode_words=decode, reward=REWARDS.__getitem__, max_length=6,
                               global_sum=lambda x: next(replay), world_size=2)
        rows = slice(offset, offset + 2)
        half = Batch(batch.image_ids[rows], batch.pooled[rows], batch.regions[rows], batch.labels, batch.label_image,
                     Noise(3, 7, total=4, offset=offset))
        build_objective("c2f", options, env_two, model).loss(model, half)[0].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad()
    for e, g0, g1 in zip(expected, *grads):
        assert_float64_close(e, (g0 + g1) / 2)
