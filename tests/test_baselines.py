"""REINFORCE baselines by name (caprl.objectives.baselines): the greedy baseline leaves every loss
bit for bit as it was; NSC (Luo 2020) is each sample's reward minus the mean of its image's other
samples, decodes no greedy caption, and needs n_samples >= 2 (refused at plan time)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import caprl.decoding
from caprl import decoding
from caprl.errors import CaprlError
from caprl.objectives import OBJECTIVES, build_objective
from caprl.objectives.baselines import BASELINES
from caprl.objectives.c2f import c2f_advantages
from caprl.objectives.listener import disc_losses
from caprl.objectives.sle import DIVERSITY, combine
from caprl.workflow import plan as wp
from conftest import default_params
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, count_red, decode
import listener_toy
import test_c2f
import test_objectives

SCST = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 3, "reward": "count_red", "temperature": 1.0,
        "entropy": 0.0}
SLE = {**{k: v for k, v in SCST.items() if k != "entropy"}, "alpha": 0.75, "diversity": "pairwise"}
C2F = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 3, "reward": "length", "temperature": 1.0}
#: the methods with a sampled-caption reward and a greedy baseline: each takes option `baseline`
TAKE_BASELINE = {"scst", "sll", "sll_sle", "c2f", "luo2018", "reinforce_joint", "st_gumbel", "st_multinomial",
                 "psst_gumbel", "psst_multinomial"}


def mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Objective.mean on one process, written out: the same operations in the same order."""
    return (values * mask).sum() * 1 / mask.sum().clamp(min=1.0)


def draw(model: Any, batch: Any, seed: int, n: int, noise: Any = None) -> tuple[Any, Any]:
    """The greedy captions and samples an objective drew after ``torch.manual_seed(seed)``, drawn again."""
    torch.manual_seed(seed)
    ctx = model.encode(batch.pooled, batch.regions)
    with torch.no_grad():
        greedy = decoding.sample(model.eval(), ctx, 6, greedy=True)
    return greedy, decoding.sample(model.train(), ctx, 6, n=n, noise=noise)


# -- the registry and the options ----------------------------------------------------------------

def test_the_methods_that_take_a_baseline_default_to_their_papers_greedy_one() -> None:
    taking = {name for name, cls in OBJECTIVES.items()
              if "baseline" in {f.name for f in dataclasses.fields(cls.Options)}}
    assert taking == TAKE_BASELINE
    objectives = default_params()["objectives"]
    assert {objectives[m]["baseline"] for m in TAKE_BASELINE} == {"greedy"}
    assert set(BASELINES) == {"greedy", "nsc"}


def test_nsc_advantage_is_each_reward_minus_the_mean_of_the_images_other_samples() -> None:
    rewards = np.array([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])  # two images, three samples each
    # image 0: 1 - (2+3)/2, 2 - (1+3)/2, 3 - (1+2)/2; image 1: 0 - (0+6)/2, 0 - 3, 6 - 0
    expected = [-1.5, 0.0, 1.5, -3.0, -3.0, 6.0]
    nsc = BASELINES["nsc"]
    assert nsc.advantage(rewards, None, 3).tolist() == expected
    assert nsc.advantage(torch.tensor(rewards, dtype=torch.float32), None, 3).tolist() == expected
    assert nsc.advantage(np.array([5.0, 2.0]), None, 2).tolist() == [3.0, -3.0]  # n = 2: the other sample
    assert not nsc.greedy and BASELINES["greedy"].greedy


def test_the_greedy_advantage_is_the_old_subtraction_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    r_sample, r_greedy = rng.random(12), rng.random(4)
    greedy = BASELINES["greedy"]
    assert np.array_equal(greedy.advantage(r_sample, r_greedy, 3), r_sample - np.repeat(r_greedy, 3))
    mix, mix_greedy = torch.rand(12), torch.rand(4)
    assert torch.equal(greedy.advantage(mix, mix_greedy, 3), mix - mix_greedy.repeat_interleave(3))


def test_an_unknown_baseline_is_refused_with_the_choices() -> None:
    model, _, env = test_objectives.setup()
    with pytest.raises(CaprlError, match=r"runs\.x\.options\.baseline: expected one of greedy, nsc, got 'mean'"):
        build_objective("scst", {**SCST, "baseline": "mean"}, env, model, where="runs.x")


@pytest.mark.parametrize("method", ["scst", "luo2018"])
def test_nsc_with_one_sample_is_refused_naming_the_keys(method: str) -> None:
    options = {"scst": SCST, "luo2018": listener_toy.JOINT}[method]
    model, _, env = test_objectives.setup()
    with pytest.raises(CaprlError, match=r"runs\.x\.options\.baseline: baseline nsc needs n_samples >= 2, got "
                                         r"runs\.x\.options\.n_samples 1"):
        build_objective(method, {**options, "n_samples": 1, "baseline": "nsc"}, env, model, where="runs.x")


def test_the_plan_refuses_nsc_with_one_sample_and_plans_an_nsc_run() -> None:
    params = default_params()
    run = params["runs"]["topdown-scst"]
    run["options"] = {**run.get("options", {}), "baseline": "nsc", "n_samples": 1}
    with pytest.raises(CaprlError, match=r"runs\.topdown-scst\.options\.baseline: baseline nsc needs n_samples >= 2"):
        wp.build_plan(params)
    params = default_params()  # the NSC run proposed for params.yaml: SCST with Luo 2020's baseline
    params["runs"]["topdown-nsc"] = {"method": "scst", "model": "topdown", "init": {"model": "topdown-xe"},
                                     "options": {"lr": 6.0e-4, "baseline": "nsc"}}
    job = wp.build_plan(params).job("synthetic", "topdown-nsc")
    assert job.spec.options["baseline"] == "nsc" and job.spec.options["n_samples"] == 5


# -- greedy: today's losses, bit for bit --------------------------------------------------------

@pytest.mark.parametrize("entropy", [0.0, 0.1])
def test_scst_greedy_loss_is_bit_identical_to_the_direct_computation(entropy: float) -> None:
    model, batch, env = test_objectives.setup()
    losses = []
    for options in ({**SCST, "entropy": entropy}, {**SCST, "entropy": entropy, "baseline": "greedy"}):
        torch.manual_seed(11)
        losses.append(build_objective("scst", options, env, model).loss(model, batch)[0])
    torch.manual_seed(11)
    ctx = model.encode(batch.pooled, batch.regions)
    with torch.no_grad():
        greedy = decoding.sample(model.eval(), ctx, 6, greedy=True)
    samples = decoding.sample(model.train(), ctx, 6, n=3, keep_entropy=entropy > 0)
    r_greedy, r_sample = count_red(None, decode(greedy.last_stage())), count_red(None, decode(samples.last_stage()))
    advantage = torch.as_tensor(r_sample - np.repeat(r_greedy, 3), dtype=torch.float32)
    expected = -mean(advantage.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1])
    if entropy > 0:
        expected = expected - entropy * mean(samples.entropy[:, -1], samples.mask[:, -1])
    assert torch.equal(losses[0], expected) and torch.equal(losses[1], expected)


def test_sll_sle_greedy_loss_is_bit_identical_to_the_direct_computation() -> None:
    model, batch, env = test_objectives.setup()
    torch.manual_seed(7)
    loss, _ = build_objective("sll_sle", SLE, env, model).loss(model, batch)
    greedy, samples = draw(model, batch, 7, 3)
    words = decode(samples.last_stage())
    diversity, _ = DIVERSITY["pairwise"]([words[3 * g:3 * g + 3] for g in range(4)])
    weights = combine(count_red(None, words).reshape(4, 3), count_red(None, decode(greedy.last_stage())),
                      diversity, 0.75)
    weight = torch.as_tensor(weights.reshape(-1), dtype=torch.float32)
    assert torch.equal(loss, -mean(weight.unsqueeze(1) * samples.logprobs[:, -1], samples.mask[:, -1]))


def test_c2f_greedy_loss_is_bit_identical_to_the_direct_computation() -> None:
    model, batch, env = test_c2f.setup(dropout=0.0)
    torch.manual_seed(11)
    loss, _ = build_objective("c2f", C2F, env, model).loss(model, batch)
    greedy, samples = draw(model, batch, 11, 3)
    stages = model.n_stages
    r_greedy = np.stack([test_c2f.length(None, decode(greedy.tokens[:, s])) for s in range(stages)])
    r_sample = np.stack([test_c2f.length(None, decode(samples.tokens[:, s])) for s in range(stages)])
    advantage = torch.as_tensor(c2f_advantages(r_sample, np.repeat(r_greedy, 3, axis=1)), dtype=torch.float32)
    expected = -torch.stack([mean(advantage[s - 1].unsqueeze(1) * samples.logprobs[:, s], samples.mask[:, s])
                             for s in range(1, stages)]).sum()
    assert torch.equal(loss, expected)


def test_luo2018_greedy_loss_is_bit_identical_to_the_direct_computation() -> None:
    model, objective, batch = listener_toy.make("luo2018", {"n_samples": 3})
    noise = dataclasses.replace(batch.noise)  # its call count as the objective finds it
    torch.manual_seed(11)
    loss, _ = objective.loss(model, batch)
    greedy, samples = draw(model, batch, 11, 3, noise=noise)
    lam, listener = listener_toy.JOINT["lam"], objective.listener
    with torch.no_grad():
        d_sample = disc_losses(listener, samples.last_stage(), batch.pooled, 3).float()
        d_greedy = disc_losses(listener, greedy.last_stage(), batch.pooled, 1).float()
    r_sample = torch.as_tensor(count_red(None, decode(samples.last_stage())), dtype=torch.float32)
    r_greedy = torch.as_tensor(count_red(None, decode(greedy.last_stage())), dtype=torch.float32)
    mix_sample, mix_greedy = (1 - lam) * r_sample - lam * d_sample, (1 - lam) * r_greedy - lam * d_greedy
    assert torch.equal(loss, objective.reinforce(mix_sample - mix_greedy.repeat_interleave(3), samples))


# -- nsc: no greedy decode, a hand-checked loss, a training step --------------------------------

def count_greedy_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap caprl.decoding.sample (what every objective decodes with) to count its greedy decodes."""
    calls: list[int] = []
    real = caprl.decoding.sample

    def sample(*args: Any, greedy: bool = False, **kwargs: Any) -> Any:
        if greedy:
            calls.append(1)
        return real(*args, greedy=greedy, **kwargs)

    monkeypatch.setattr(caprl.decoding, "sample", sample)
    return calls


def built(method: str, baseline: str) -> tuple[Any, Any, Any]:
    """(model, objective, batch) of ``method`` on its toy setup, 3 samples an image."""
    if method in ("scst", "sll_sle", "c2f"):
        model, batch, env = (test_c2f.setup(dropout=0.0) if method == "c2f" else test_objectives.setup())
        options = {"scst": SCST, "sll_sle": SLE, "c2f": C2F}[method]
        return model, build_objective(method, {**options, "baseline": baseline}, env, model), batch
    return listener_toy.make(method, {"n_samples": 3, "baseline": baseline})


@pytest.mark.parametrize("method", ["scst", "sll_sle", "c2f", "luo2018", "reinforce_joint", "st_multinomial",
                                    "psst_gumbel"])
def test_nsc_decodes_no_greedy_caption(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    greedy_decodes = count_greedy_decodes(monkeypatch)
    for baseline, decodes in (("greedy", 1), ("nsc", 0)):
        model, objective, batch = built(method, baseline)
        greedy_decodes.clear()
        torch.manual_seed(3)
        loss, metrics = objective.loss(model, batch)
        assert len(greedy_decodes) == decodes, baseline
        assert ("reward_greedy" in metrics) == (baseline == "greedy") and torch.isfinite(loss)


@pytest.mark.numerics
def test_scst_nsc_loss_equals_the_hand_computed_value() -> None:
    model, batch, env = test_objectives.setup()
    model, batch = to_float64(model, batch)  # the objective's sums and the hand's may add in other orders
    torch.manual_seed(11)
    loss, metrics = build_objective("scst", {**SCST, "baseline": "nsc"}, env, model).loss(model, batch)
    torch.manual_seed(11)
    samples = decoding.sample(model.train(), model.encode(batch.pooled, batch.regions), 6, n=3)
    r = count_red(None, decode(samples.last_stage())).reshape(4, 3)
    others = np.array([[(row.sum() - row[j]) / 2 for j in range(3)] for row in r])  # mean of the other two
    advantage = torch.as_tensor((r - others).reshape(-1), dtype=torch.float32)  # halves: exact in float32
    mask = samples.mask[:, -1]
    expected = -(advantage[:, None] * samples.logprobs[:, -1] * mask).sum() / mask.sum()
    assert_float64_close(loss, expected)
    assert metrics["reward_sample"] == r.mean()


def test_one_scst_nsc_optimiser_step_has_a_finite_loss_and_moves_the_model() -> None:
    model, batch, env = test_objectives.setup()
    objective = build_objective("scst", {**SCST, "n_samples": 4, "baseline": "nsc"}, env, model)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    loss, _ = objective.loss(model, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
