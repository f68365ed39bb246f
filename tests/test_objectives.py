"""Objectives: XE equals the hand-computed NLL; SCST's advantage is sample minus greedy reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from caprl import decoding
from caprl.models import build_model
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.objectives.xe import gold_targets, token_mask
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, WORDS, count_red, decode, greedy_reward_gain


def setup(n_images: int = 4):
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), 5, 3)
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([[1, 2, 3, 0], [1, 4, 5, 0]] * n_images)
    batch = Batch(image_ids=list(range(n_images)), pooled=torch.randn(n_images, 5, generator=gen),
                  regions=torch.randn(n_images, 3, 5, generator=gen), labels=labels,
                  label_image=torch.arange(n_images).repeat_interleave(2))
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    return model, batch, env


def redraw(model, batch: Batch, seed: int, n: int = 3):
    """The context, greedy captions and ``n`` samples per image an objective drew after
    ``torch.manual_seed(seed)``, drawn again the same way (to recompute its loss by hand)."""
    torch.manual_seed(seed)
    ctx = model.encode(batch.pooled, batch.regions)
    greedy = decoding.sample(model.eval(), ctx, 6, greedy=True)
    return ctx, greedy, decoding.sample(model.train(), ctx, 6, n=n)


@pytest.mark.numerics
def test_xe_matches_hand_computed_nll() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's forward (rows per image) against a plain one
    loss, _ = build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR}, env, model).loss(model, batch)
    ctx = model.encode(batch.pooled[batch.label_image], batch.regions[batch.label_image])
    logprobs = model.teacher_forcing(ctx, batch.labels)[:, 0]
    targets, mask = gold_targets(batch.labels), token_mask(batch.labels)
    nll = [-logprobs[i, t, targets[i, t]] for i in range(len(targets)) for t in range(targets.shape[1]) if mask[i, t]]
    assert len(nll) == 4 * 2 * 4  # 3 words + end token per caption
    assert_float64_close(loss, torch.stack(nll).mean())


@pytest.mark.numerics
def test_scst_loss_is_reinforce_with_greedy_baseline() -> None:
    model, batch, env = setup()
    model, batch = to_float64(model, batch)  # the objective's sums and the hand's may add in other orders
    objective = build_objective("scst", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 3, "reward": "count_red", "temperature": 1.0, "entropy": 0.0}, env, model)
    torch.manual_seed(11)
    loss, metrics = objective.loss(model, batch)
    # recompute by hand with the same random stream
    _, greedy, samples = redraw(model, batch, 11)
    r_greedy = count_red(None, decode(greedy.last_stage()))
    r_sample = count_red(None, decode(samples.last_stage()))
    advantage = torch.tensor(r_sample - np.repeat(r_greedy, 3), dtype=torch.float32)  # integers: exact
    expected = -(advantage[:, None] * samples.logprobs[:, 0] * samples.mask[:, 0]).sum() / samples.mask[:, 0].sum()
    assert_float64_close(loss, expected)
    assert metrics["reward_sample"] == r_sample.mean()


def test_scst_increases_the_reward() -> None:
    """A few hundred SCST steps on the toy reward make the greedy caption say 'red' more."""
    model, batch, env = setup()
    objective = build_objective("scst", {"lr": 1e-2, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "cider_d", "temperature": 1.0, "entropy": 0.0}, env, model)
    first, last = greedy_reward_gain(objective, model, batch, steps=60)
    assert last > first + 1.0


def test_unknown_objective_option_is_an_error() -> None:
    import pytest

    from caprl.errors import CaprlError

    model, _, env = setup()
    with pytest.raises(CaprlError, match="n_samples"):
        build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 2}, env, model)


def test_step_decay_options_are_checked_and_give_the_epochs_factor() -> None:
    """lr_decay_every / lr_decay_rate (every objective): x rate every `every` epochs from epoch 0
    (self-critical.pytorch's learning_rate_decay_every / _rate); 0 epochs: no decay; a
    negative period or a non-positive rate names the key."""
    import pytest

    from caprl.errors import CaprlError

    model, _, env = setup()
    options = build_objective("xe", {"lr": 1e-3, "epochs": 9, "lr_decay_every": 3, "lr_decay_rate": 0.8}, env,
                              model).options
    assert [options.lr_scale(e) for e in range(7)] == [1.0, 1.0, 1.0, 0.8, 0.8, 0.8, 0.8 ** 2]
    constant = build_objective("xe", {"lr": 1e-3, "epochs": 9, **CONSTANT_LR}, env, model).options
    assert {constant.lr_scale(e) for e in range(20)} == {1.0}
    for key, value in (("lr_decay_every", -1), ("lr_decay_rate", 0.0), ("lr_decay_every", 1.5)):
        with pytest.raises(CaprlError, match=rf"runs\.x\.options\.{key}"):
            build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, key: value}, env, model, where="runs.x")
    with pytest.raises(CaprlError, match="lr_decay_every, lr_decay_rate missing"):
        build_objective("xe", {"lr": 1e-3, "epochs": 1}, env, model, where="runs.x")
