"""Paper 004 (PSST): the listener, eq. 4, recall@K, and the discriminative objectives (luo2018,
reinforce_joint, ST / PSST Gumbel and multinomial, frozen_speaker, the listener's pre-training):
what reaches the listener, which network each method updates, and a tiny real training
(listener pre-training, then PSST started from it) through the trainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.models import checkpoint
from caprl.errors import CaprlError
from caprl.models import build_model
from caprl.objectives import Batch, Objective, ObjectiveEnv, build_objective
from caprl.retrieval import Listener, caption_lengths, ranks_of, recall_report, vse_hinge
from listener_toy import (BASE, CONFIG, FEAT, JOINT, OPTIONS, PSST, ST, TRAINED, ToyData, grad_sum, is_one_hot,
                          make, make_env, record_decodes, record_listener_inputs, same, snapshot)
from numerics import assert_float64_close, summation_atol, to_float64
from toy import WORDS, count_red, decode


# --- the listener, eq. 4, recall --------------------------------------------------------------
@pytest.mark.numerics
def test_listener_scores_token_ids_and_their_one_hot_rows_alike() -> None:
    torch.manual_seed(0)
    listener = Listener(CONFIG, len(WORDS), FEAT)
    tokens = torch.tensor([[1, 2, 3, 0, 0], [1, 4, 0, 0, 0], [5, 5, 5, 5, 5]])
    # a lookup against a product with one-hot rows (another kernel): compared in float64
    listener, pooled = to_float64(listener, torch.randn(2, FEAT))
    by_ids = listener.similarity(tokens, pooled)
    by_rows = listener.similarity(F.one_hot(tokens, len(WORDS)).double(), pooled, caption_lengths(tokens))
    assert by_ids.shape == (3, 2)
    assert_float64_close(by_rows, by_ids)


def test_eq4_hardest_negatives_on_a_hand_made_matrix() -> None:
    sim = torch.tensor([[0.9, 0.3, 0.1],
                        [0.2, 0.8, 0.7],
                        [0.4, 0.5, 0.6]])
    # margin 0.2; caption n of image n: hinge on the hardest other image of its row + on the
    # hardest other caption of its image's column:
    # c0: 0.2-0.9+max(.3,.1) < 0 -> 0;  0.2-0.9+max(.2,.4) < 0 -> 0;  total 0
    # c1: 0.2-0.8+max(.2,.7) = 0.1;     0.2-0.8+max(.3,.5) < 0 -> 0;  total 0.1
    # c2: 0.2-0.6+max(.4,.5) = 0.1;     0.2-0.6+max(.1,.7) = 0.3;     total 0.4
    loss = vse_hinge(sim, torch.arange(3), 0.2)
    torch.testing.assert_close(loss, torch.tensor([0.0, 0.1, 0.4]))


def test_eq4_captions_of_the_same_image_are_not_negatives() -> None:
    sim = torch.tensor([[0.9, 0.5],    # c0, image 0
                        [0.5, 0.2],    # c1, image 0
                        [0.4, 0.65],   # c2, image 1
                        [0.2, 0.8]])   # c3, image 1
    # image 0's hardest negative caption: c2/c3 on column 0 -> 0.4 (not c0's 0.9 for c1);
    # image 1's: c0/c1 on column 1 -> 0.5 (not c3's 0.8 for c2). Image terms are all < 0.
    # c0: 0.2-0.9+0.4 < 0 -> 0;  c1: 0.2-0.5+0.4 = 0.1;  c2: 0.2-0.65+0.5 = 0.05;  c3: 0.2-0.8+0.5 < 0 -> 0
    loss = vse_hinge(sim, torch.tensor([0, 0, 1, 1]), 0.2)
    torch.testing.assert_close(loss, torch.tensor([0.0, 0.1, 0.05, 0.0]))


def test_recall_at_k_and_mean_rank_on_a_hand_made_ranking() -> None:
    sim = np.array([[0.9, 0.1, 0.2, 0.3],    # own image first: rank 1
                    [0.5, 0.4, 0.6, 0.1],    # 0.5 and 0.6 beat 0.4: rank 3
                    [0.1, 0.8, 0.7, 0.2],    # 0.8 beats 0.7: rank 2
                    [0.9, 0.8, 0.7, 0.1]])   # last: rank 4
    ranks = ranks_of(sim)
    assert ranks.tolist() == [1, 3, 2, 4]
    assert recall_report(ranks, ks=(1, 2, 3)) == {"R@1": 0.25, "R@2": 0.5, "R@3": 0.75, "mean_rank": 2.5,
                                                   "median_rank": 2.5, "n_images": 4}
    assert recall_report(ranks)["R@5"] == 1.0
    assert ranks_of(np.array([[0.5, 0.5], [0.1, 0.9]])).tolist() == [2, 1]  # a tie counts against


# --- what the straight-through methods pass to the listener -----------------------------------
@pytest.mark.parametrize("method", ["st_multinomial", "st_gumbel"])
def test_straight_through_passes_one_hot_forward_and_the_soft_gradient_backward(method: str) -> None:
    model, objective, batch = make(method, {"lam": 1.0})  # l_disc alone: (1 - lam) l_nat = 0
    calls, drawn = record_listener_inputs(objective), record_decodes(objective)
    loss, stats = objective.loss(model, batch)
    (rows, lengths), = calls
    tokens = drawn[0][1].last_stage()
    assert rows.shape[0] == 8 and rows.shape[-1] == len(WORDS) and rows.requires_grad
    assert torch.equal(lengths, caption_lengths(tokens))
    for i in range(8):  # forward: each caption's rows are the one-hot rows of its sampled words
        n = int(lengths[i])
        torch.testing.assert_close(rows[i, :n].detach(), F.one_hot(tokens[i, :n], len(WORDS)).float(),
                                   atol=summation_atol(3, 1.0), rtol=0)  # ST's h - p + p: 3 terms <= 1
    loss.backward()
    # backward: the one-hot rows carried the distributions' gradient to the speaker (and the listener)
    assert sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None) > 0
    assert sum(float(p.grad.abs().sum()) for p in objective.listener.parameters() if p.grad is not None) > 0
    assert np.isfinite(stats["l_disc"])


@pytest.mark.parametrize("method", ["psst_multinomial", "psst_gumbel"])
def test_psst_passes_soft_rows_for_a_seeded_rho_fraction_and_one_hot_for_the_rest(method: str) -> None:
    model, objective, batch = make(method, {"rho": 0.25})
    calls = record_listener_inputs(objective)
    masks = []
    for global_seed in (1, 2):  # the global RNG differs, the step does not: the same captions are relaxed
        torch.manual_seed(global_seed)
        batch.noise = decoding.Noise(seed=0, step=5, total=4)
        objective.loss(model, batch)
        rows, lengths = calls[-1]
        soft = torch.tensor([not is_one_hot(rows[i, : max(int(lengths[i]), 1)]) for i in range(8)])
        for i in range(8):
            n = max(int(lengths[i]), 1)
            if soft[i]:  # whole distributions: sum to 1, more than one word possible
                torch.testing.assert_close(rows[i, :n].detach().sum(-1), torch.ones(n))
                assert bool(((rows[i, :n] > 0).sum(-1) > 1).all())
        masks.append(soft)
    assert int(masks[0].sum()) == round(0.25 * 8) == 2
    assert torch.equal(masks[0], masks[1])
    assert torch.equal(masks[0], objective.relaxed(8, batch, torch.device("cpu")))
    other_steps = {tuple(objective.relaxed(8, dataclasses.replace(batch, noise=decoding.Noise(0, step, total=4)),
                                           torch.device("cpu")).tolist()) for step in range(8)}
    assert len(other_steps) > 1  # the choice changes with the step


# --- who learns ---------------------------------------------------------------------------------
def optimise(objective: Objective, model: Any, batch: Batch, steps: int = 3) -> None:
    """A few optimiser steps on the objective's own groups (as the trainer builds them)."""
    optimizer = torch.optim.Adam(objective.param_groups(model))
    for step in range(steps):
        batch.noise = decoding.Noise(seed=0, step=step, total=4)
        loss, _ = objective.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_luo2018_frozen_listener_receives_no_update() -> None:
    model, objective, batch = make("luo2018")
    listener_before, model_before = snapshot(objective.listener), snapshot(model)
    grouped = {id(p) for g in objective.param_groups(model) for p in g["params"]}
    assert not grouped & {id(p) for p in objective.listener.parameters()}
    objective.train()
    assert not objective.listener.training  # kept in eval mode
    optimise(objective, model, batch)
    assert same(objective.listener, listener_before)
    assert not same(model, model_before)


def test_frozen_speaker_trains_the_listener_only() -> None:
    model, objective, batch = make("frozen_speaker")
    assert objective.captioner and objective.retrieval and objective.select == "R@10"
    listener_before, model_before = snapshot(objective.listener), snapshot(model)
    optimise(objective, model, batch)
    assert same(model, model_before)
    assert not same(objective.listener, listener_before)


def test_reinforce_joint_each_turn_trains_only_its_network() -> None:
    model, objective, batch = make("reinforce_joint")
    assert objective.turns == ("speaker", "listener")
    for turn, trained, frozen in [("speaker", model, objective.listener), ("listener", objective.listener, model)]:
        model.zero_grad(set_to_none=True)
        objective.zero_grad(set_to_none=True)
        loss, _ = objective.turn_loss(model, batch, turn)
        loss.backward()
        assert all(p.grad is None for p in frozen.parameters()), turn
        assert grad_sum(trained) > 0, turn
    assert model.training and objective.listener.training  # the frozen network's mode is restored
    with pytest.raises(CaprlError, match="unknown turn"):
        objective.turn_loss(model, batch, "critic")


def mixed_reinforce(model: Any, batch: Batch, advantage_of: Any) -> torch.Tensor:
    """The self-critical loss recomputed by hand: greedy (eval, no grad) and 2 samples per image
    with the batch's noise (step 0), ``advantage_of(greedy, samples) -> [8]``."""
    noise = decoding.Noise(seed=0, step=0, total=4)
    ctx = model.encode(batch.pooled, batch.regions)
    with torch.no_grad():
        greedy = decoding.sample(model.eval(), ctx, 6, greedy=True)
    samples = decoding.sample(model.train(), ctx, 6, n=2, noise=noise)
    advantage = advantage_of(greedy, samples)
    logprobs, mask = samples.logprobs[:, 0], samples.mask[:, 0]
    return -(advantage * (logprobs * mask).sum(1)).mean()  # per caption: sum over its tokens, mean over captions


@pytest.mark.numerics
def test_reinforce_joint_speaker_loss_is_baselined_by_the_gold_caption() -> None:
    # in float64 (the objective's sums against the hand's), the advantages formed in float32 as the objective does
    model, objective, batch = to_float64(*make("reinforce_joint"))
    loss, _ = objective.turn_loss(model, batch, "speaker")
    listener, lam = objective.listener, 0.5
    gold = batch.labels[::2]  # each image's first gold caption

    def advantage(greedy: decoding.Samples, samples: decoding.Samples) -> torch.Tensor:
        with torch.no_grad():
            d_sample = vse_hinge(listener.similarity(samples.last_stage(), batch.pooled),
                                 torch.arange(4).repeat_interleave(2), 0.2).float()
            d_gold = vse_hinge(listener.similarity(gold, batch.pooled), torch.arange(4), 0.2).float()
        r_sample = torch.tensor(count_red(None, decode(samples.last_stage())), dtype=torch.float32)
        r_greedy = torch.tensor(count_red(None, decode(greedy.last_stage())), dtype=torch.float32)
        return lam * (d_gold.repeat_interleave(2) - d_sample) + (1 - lam) * (r_sample - r_greedy.repeat_interleave(2))

    assert_float64_close(loss, mixed_reinforce(model, batch, advantage))


@pytest.mark.numerics
def test_luo2018_reward_mixes_cider_and_the_listener_loss_baselined_by_greedy() -> None:
    # in float64 (the objective's sums against the hand's), the advantages formed in float32 as the objective does
    model, objective, batch = to_float64(*make("luo2018"))
    loss, _ = objective.loss(model, batch)
    listener, lam = objective.listener, 0.5

    def advantage(greedy: decoding.Samples, samples: decoding.Samples) -> torch.Tensor:
        def mixed(tokens: torch.Tensor, n: int) -> torch.Tensor:
            with torch.no_grad():
                d = vse_hinge(listener.similarity(tokens, batch.pooled), torch.arange(4).repeat_interleave(n),
                              0.2).float()
            return (1 - lam) * torch.tensor(count_red(None, decode(tokens)), dtype=torch.float32) - lam * d

        return mixed(samples.last_stage(), 2) - mixed(greedy.last_stage(), 1).repeat_interleave(2)

    assert_float64_close(loss, mixed_reinforce(model, batch, advantage))


@pytest.mark.parametrize("method", sorted(OPTIONS))
@pytest.mark.parametrize("step", [0, 1])
def test_every_method_gives_a_finite_loss_that_backpropagates(method: str, step: int) -> None:
    model, objective, batch = make(method)
    batch.noise = decoding.Noise(seed=0, step=step, total=4)
    loss, stats = objective.loss(model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert grad_sum(model) + grad_sum(objective) > 0
    assert stats and all(isinstance(v, float) and np.isfinite(v) for v in stats.values())
    assert objective.retrieval and objective.select == "R@10"


@pytest.mark.parametrize("method, options, key", [
    ("psst_multinomial", ST, "rho"),              # missing
    ("st_multinomial", PSST, "rho"),              # unknown: ST has no rho
    ("luo2018", TRAINED, "listener_lr"),          # unknown: Luo's listener is frozen
    ("reinforce_joint", JOINT, "listener_lr"),    # missing
    ("st_gumbel", TRAINED, "tau"),                # missing
    ("frozen_speaker", BASE, "n_samples"),        # missing
    ("listener", {**BASE, "warmup_epochs": 1, "lam": 0.1}, "lam"),    # unknown
    ("psst_gumbel", {**PSST, "rho": "half"}, "rho"),  # mistyped
    ("psst_multinomial", {**PSST, "variant": "both"}, "variant: expected one of code, paper, got 'both'"),  # not one
    ("psst_gumbel", {k: v for k, v in PSST.items() if k != "variant"}, "variant"),  # missing
])
def test_a_wrong_or_missing_option_names_the_key(method: str, options: dict[str, Any], key: str) -> None:
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16}, len(WORDS), FEAT, 3)
    with pytest.raises(CaprlError, match=key):
        build_objective(method, options, make_env(), model, where="runs.x")


def test_a_missing_listener_section_is_named() -> None:
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    with pytest.raises(CaprlError, match="listener:"):
        build_objective("psst_multinomial", PSST, env, model)


# --- validation and a real (tiny) training -------------------------------------------------------
def test_listener_validation_is_the_recall_of_the_first_gold_captions() -> None:
    model, objective, _ = make("listener")
    data = ToyData()
    report = objective.validation(model, data)
    assert objective.listener.training  # its mode is restored
    val = data.batch(data.split_ids("val"))
    with torch.no_grad():
        expected = recall_report(ranks_of(objective.listener.similarity(val.labels[::2], val.pooled)))
    assert report == {k: expected[k] for k in ("R@1", "R@5", "R@10")}
    greedy = build_objective("psst_multinomial", PSST, make_env(), model)
    assert set(greedy.validation(model, data)) == {"R@1", "R@5", "R@10"}


class NullTracker:
    run_id = ""

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass


def fit(objective: Objective, model: Any, state_dir: Path) -> list[dict[str, Any]]:
    """Two epochs of the real trainer on the toy data (8 images a batch)."""
    import signal

    from caprl.training.loop import LoopConfig, RunMeta, Trainer

    loop = LoopConfig(epochs=2, batch_size=8, grad_clip=2.0, checkpoint_every=100,
                      log_every=100, max_length=6, seed=0)
    meta = RunMeta(arch="fc", run={"name": objective.name, "method": objective.name}, vocab_sha256="toy",
                   config_hash=objective.name)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        trainer = Trainer(model, objective, ToyData(), loop, lambda m: {"CIDEr-D": 0.0}, state_dir, meta,
                          NullTracker())
        return trainer.fit(ToyData().split_ids("train")).history
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_listener_pretraining_then_psst_from_it_through_the_trainer(tmp_path: Path) -> None:
    from caprl.training.run import load_inits

    model, pretraining, _ = make("listener", {"epochs": 2})
    model_before = snapshot(model)
    history = fit(pretraining, model, tmp_path / "listener")
    assert [sorted(k for k in h if k.startswith("val_")) for h in history] == [["val_R@1", "val_R@10", "val_R@5"]] * 2
    best = checkpoint.load(tmp_path / "listener" / "best.pt")
    assert best.position["select"] == "R@10" and set(best.modules) == {"model", "listener"}
    assert same(model, model_before)  # the caption model had no optimiser group

    speaker, psst, _ = make("psst_multinomial", {"epochs": 2}, seed=1)
    path = str(tmp_path / "listener" / "best.pt")
    load_inits({"model": speaker, **psst.modules_to_save()}, {"model": path, "listener": path},
               {"model": "pre", "listener": "pre"}, "psst", "toy")
    pretrained = snapshot(psst.listener)
    assert all(torch.equal(v, best.modules["listener"].state[k]) for k, v in pretrained.items())
    history = fit(psst, speaker, tmp_path / "psst")
    assert {"val_CIDEr-D", "val_R@1", "val_R@5", "val_R@10"} <= set(history[-1])
    last = checkpoint.load(tmp_path / "psst" / "last.pt")
    assert last.optimizer is not None and [g["name"] for g in last.optimizer["param_groups"]] == ["model", "listener"]
    assert not same(psst.listener, pretrained) and not same(speaker, model_before)
