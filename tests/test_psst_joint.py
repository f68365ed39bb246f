"""Paper 004's joint methods as the paper writes them: PSST's two variants (the text's relaxed
captions fed forward, the authors' per-token relaxation), l_nat on a fresh sample for PSST, one
per-caption scale for lam in every method, and REINFORCE joint training in turns (one speaker
and one listener update per batch)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.models import timeshared
from caprl.objectives import Batch, Objective
from caprl.objectives.discriminative import speaker_samples
from caprl.retrieval import vse_hinge
from listener_toy import grad_sum, is_one_hot, make, record_decodes, record_listener_inputs, same, snapshot
from numerics import assert_float64_close, assert_summation_close, summation_atol, to_float64
from toy import WORDS, count_red, decode, record_step_inputs

V = len(WORDS)
JOINT_METHODS = ["luo2018", "reinforce_joint", "st_gumbel", "st_multinomial", "psst_gumbel", "psst_multinomial"]


def speaker_loss(objective: Objective, model: Any, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss that trains the speaker: reinforce_joint's speaker turn, every other method's loss."""
    turns = getattr(objective, "turns", ())
    return objective.turn_loss(model, batch, "speaker") if turns else objective.loss(model, batch)


# --- PSST, variant paper (the text) and code (the authors' code) ------------------------------------
def test_psst_paper_at_rho_1_is_deterministic_whatever_the_noise() -> None:
    model, objective, batch = make("psst_multinomial", {"rho": 1.0, "lam": 1.0})
    calls = record_listener_inputs(objective)
    stats = []
    for seed in (1, 2):  # other global RNG, other sampling noise
        torch.manual_seed(seed)
        batch.noise = decoding.Noise(seed=seed, step=seed, total=4)
        stats.append(objective.loss(model, batch)[1])
    (rows_a, lengths_a), (rows_b, lengths_b) = calls
    assert not is_one_hot(rows_a)
    assert torch.equal(rows_a, rows_b) and torch.equal(lengths_a, lengths_b)
    assert stats[0]["l_disc"] == stats[1]["l_disc"]


def test_psst_paper_relaxed_captions_feed_their_relaxed_words_forward_the_others_their_word() -> None:
    model, objective, batch = make("psst_multinomial", {"rho": 0.5})
    drawn = record_decodes(objective)
    seen = record_step_inputs(model)
    objective.loss(model, batch)
    relaxed = objective.relaxed(8, batch, torch.device("cpu"))
    _, samples, _ = drawn[0]
    assert samples.soft is not None and int(relaxed.sum()) == 4
    decode_inputs = [s for s in seen if s.shape[0] == 8 and s.is_floating_point()]  # the relaxed decode's steps >= 1
    assert decode_inputs
    for i, fed in enumerate(decode_inputs, start=1):
        words, live = samples.tokens[:, 0, i - 1], samples.tokens[:, 0, i - 1] > 0
        keep = live & relaxed
        torch.testing.assert_close(fed[keep, 0].detach(), samples.soft[keep, 0, i - 1].detach(), rtol=0, atol=0)
        assert fed.requires_grad
        torch.testing.assert_close(fed[~relaxed, 0], F.one_hot(words[~relaxed], V).float(), rtol=0, atol=0)


def test_psst_code_relaxes_tokens_step_by_step_and_every_row_feeds_its_passed_row() -> None:
    model, objective, batch = make("psst_gumbel", {"rho": 0.5, "variant": "code"})
    drawn = record_decodes(objective)
    seen = record_step_inputs(model)
    objective.loss(model, batch)
    relaxed = objective.relaxed(8, batch, torch.device("cpu"))
    assert relaxed.shape == (8, 6) and 0 < int(relaxed.sum()) < 48
    _, samples, _ = drawn[0]
    assert samples.soft is not None
    live = samples.mask[:, 0].bool()
    one_hot = (samples.soft[:, 0].detach() - F.one_hot(samples.soft[:, 0].argmax(-1), V).float()).abs().amax(-1) < 1e-6
    steps = live.shape[1]
    assert torch.equal(one_hot[live], ~relaxed[:, :steps][live])
    decode_inputs = [s for s in seen if s.shape[0] == 8 and s.is_floating_point()]
    for i, fed in enumerate(decode_inputs, start=1):
        keep = samples.tokens[:, 0, i - 1] > 0
        torch.testing.assert_close(fed[keep, 0].detach(), samples.soft[keep, 0, i - 1].detach(), rtol=0,
                                   atol=summation_atol(3, 1.0))  # ST's h - p + p: 3 terms <= 1


@pytest.mark.parametrize("method", ["st_multinomial", "psst_multinomial", "psst_gumbel"])
def test_psst_l_nat_is_reinforce_on_a_fresh_sample_st_reuses_its_own(method: str) -> None:
    model, objective, batch = make(method)
    drawn = record_decodes(objective)
    objective.loss(model, batch)
    _, samples, nat = drawn[0]
    if method.startswith("st_"):
        assert nat is samples
        return
    assert nat is not samples and nat.soft is None  # a plain sample of the policy, with the batch's noise
    fresh = decoding.sample(model, model.encode(batch.pooled, batch.regions), 6, n=2,
                            noise=decoding.Noise(seed=0, step=0, total=4))
    assert torch.equal(nat.tokens, fresh.tokens)


# --- one meaning of lam: both terms of eq. 3 per caption -------------------------------------------
def record_reinforce(objective: Objective) -> list[tuple[torch.Tensor, decoding.Samples]]:
    calls: list[tuple[torch.Tensor, decoding.Samples]] = []
    real = objective.reinforce

    def reinforce(advantage: torch.Tensor, samples: decoding.Samples) -> torch.Tensor:
        calls.append((advantage.detach().clone(), samples))
        return real(advantage, samples)

    objective.reinforce = reinforce  # type: ignore[method-assign]
    return calls


def per_caption(advantage: torch.Tensor, samples: decoding.Samples) -> torch.Tensor:
    """REINFORCE written out: -mean over captions of advantage * (sum of the caption's log p)."""
    return -(advantage * (samples.logprobs[:, -1] * samples.mask[:, -1]).sum(-1)).mean()


@pytest.mark.numerics
@pytest.mark.parametrize("method", JOINT_METHODS)
def test_l_nat_is_a_per_caption_reinforce_mean_in_every_joint_method(method: str) -> None:
    model, objective, batch = to_float64(*make(method, {"lam": 0.0}, seed=3))  # the objective's mean and the hand's
    calls = record_reinforce(objective)
    loss, _ = speaker_loss(objective, model, batch)
    (advantage, samples), = calls
    assert advantage.abs().sum() > 0
    assert_float64_close(loss, per_caption(advantage, samples))
    per_token = -(advantage[:, None] * samples.logprobs[:, -1] * samples.mask[:, -1]).sum() / samples.mask[:, -1].sum()
    assert not torch.allclose(loss, per_token)  # the old normalisation, ~ a caption's length smaller


@pytest.mark.numerics
def test_lam_trades_the_same_two_per_caption_terms_in_luo2018_and_st_multinomial() -> None:
    """In float64 (the objectives' sums against the hand's); the objectives form their advantages in
    float32, and so does the hand (tests/numerics.py)."""
    lam = 0.3
    model, luo, batch = to_float64(*make("luo2018", {"lam": lam}, seed=3))
    calls = record_reinforce(luo)
    loss, _ = luo.loss(model, batch)
    (mixed, samples), = calls
    greedy = decoding.sample(model.eval(), model.encode(batch.pooled, batch.regions), 6, greedy=True)
    model.train()
    with torch.no_grad():
        d_sample = vse_hinge(luo.listener.similarity(samples.last_stage(), batch.pooled),
                             torch.arange(4).repeat_interleave(2), 0.2).float()
        d_greedy = vse_hinge(luo.listener.similarity(greedy.last_stage(), batch.pooled), torch.arange(4), 0.2).float()
    reward = lambda s: torch.tensor(count_red(None, decode(s.last_stage())), dtype=torch.float32)  # noqa: E731
    advantage_disc = d_greedy.repeat_interleave(2) - d_sample  # reward -l_disc, greedy baseline
    advantage_nat = reward(samples) - reward(greedy).repeat_interleave(2)
    # luo2018 forms (1 - lam) r - lam d per caption, then sample - greedy: the same 4 float32 terms in another order
    terms = torch.cat([reward(samples), reward(greedy), d_sample, d_greedy]).abs().max()
    assert_summation_close(mixed, lam * advantage_disc + (1 - lam) * advantage_nat, n=4, magnitude=float(terms))
    # so, REINFORCE being linear in the advantage, the loss's gradient is lam * that of the disc term
    # + (1 - lam) * that of the nat term: the gradient of the per-caption REINFORCE of ``mixed``
    params = [p for p in model.parameters() if p.requires_grad]
    grad_of = lambda x: torch.autograd.grad(x, params, retain_graph=True, allow_unused=True)  # noqa: E731
    for got, want in zip(grad_of(loss), grad_of(per_caption(mixed, samples))):
        assert_float64_close(got, want)
    # st_multinomial: lam * (caption mean of eq. 4) + (1 - lam) * the same per-caption REINFORCE
    model, st, batch = to_float64(*make("st_multinomial", {"lam": lam}, seed=3))
    calls, inputs = record_reinforce(st), record_listener_inputs(st)
    loss, _ = st.loss(model, batch)
    (advantage, samples), = calls
    (rows, lengths), = inputs
    d = vse_hinge(st.listener.similarity(rows, batch.pooled, lengths), torch.arange(4).repeat_interleave(2), 0.2)
    assert_float64_close(loss, lam * d.mean() + (1 - lam) * per_caption(advantage, samples))


# --- REINFORCE joint training in turns ---------------------------------------------------------------
def run_turns(objective: Objective, model: Any, batch: Batch, optimizer: torch.optim.Optimizer,
              on_turn: Any = None) -> None:
    """One batch as the trainer runs an objective with turns: per turn one full optimiser step."""
    for turn in objective.turns:
        optimizer.zero_grad(set_to_none=True)
        timeshared.reset(model)
        before = (snapshot(model), snapshot(objective.listener))
        loss, stats = objective.turn_loss(model, batch, turn)
        loss.backward()
        timeshared.check(model)
        optimizer.step()
        assert stats and all(isinstance(v, float) for v in stats.values())
        if on_turn is not None:
            on_turn(turn, *before)


def test_reinforce_joint_updates_the_speaker_on_every_batch_then_the_listener_on_its_new_samples() -> None:
    model, objective, batch = make("reinforce_joint")
    optimizer = torch.optim.Adam(objective.param_groups(model))
    inputs = record_listener_inputs(objective)
    moved: list[tuple[int, str, bool, bool]] = []
    for step in range(2):  # the old alternation trained the speaker on even trainer steps only
        batch.noise = decoding.Noise(seed=0, step=step, total=4)

        def listener_draw() -> torch.Tensor:  # the listener turn's draw: the batch noise's second call
            noise = decoding.Noise(seed=0, step=step, total=4, calls=1)
            return speaker_samples(model, dataclasses.replace(batch, noise=noise), 2, 6).last_stage()

        stale = listener_draw()  # before this batch's speaker turn

        def on_turn(turn: str, speaker_before: Any, listener_before: Any) -> None:
            moved.append((step, turn, not same(model, speaker_before), not same(objective.listener, listener_before)))

        run_turns(objective, model, batch, optimizer, on_turn)
        # the listener's turn read the samples of the speaker as updated by this batch's speaker turn
        assert batch.noise.calls == 2
        fresh = listener_draw()
        assert torch.equal(inputs[-1][0], fresh) and not torch.equal(fresh, stale)
    assert moved == [(0, "speaker", True, False), (0, "listener", False, True),
                     (1, "speaker", True, False), (1, "listener", False, True)]


def test_reinforce_joint_without_turns_trains_both_networks_in_one_step() -> None:
    model, objective, batch = make("reinforce_joint")
    loss, stats = objective.loss(model, batch)
    loss.backward()
    assert grad_sum(model) > 0 and grad_sum(objective.listener) > 0
    assert {"l_disc", "listener_l_disc"} <= set(stats)
