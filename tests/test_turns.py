"""Objectives with turns (paper 004's alternating speaker / listener updates): the trainer makes
one full update per turn on the same batch, each moving only the parameters its loss reaches,
in one process and under DDP, and a killed run resumes bit-identical."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from caprl.models import checkpoint
from caprl.models import build_model
from caprl.objectives import Batch, ObjectiveEnv
from caprl.objectives.xe import CrossEntropy, XEOptions
from caprl.training.loop import Preempted
from conftest import sigterm_after_step
from numerics import assert_float64_close, mean_atol, to_float64
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, decode, fit, toy_trainer

TURNS = ("speaker", "probe")


@dataclass
class TwoTurnOptions(XEOptions):
    probe_lr: float = 0.0


class TwoTurns(CrossEntropy):
    """Turn ``speaker``: the caption model's XE (the probe untouched). Turn ``probe``: a linear
    probe of the pooled features guessing each gold caption's first word (the caption model
    untouched). Disjoint parameters, one optimiser with a group each."""

    Options = TwoTurnOptions
    options: TwoTurnOptions
    name = "two_turns"
    turns = TURNS

    def __init__(self, options: TwoTurnOptions, env: ObjectiveEnv, model: Any) -> None:
        super().__init__(options, env, model)
        self.probe = nn.Linear(FEAT, model.vocab_size)

    def param_groups(self, model: Any) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.probe.parameters()), "lr": self.options.probe_lr, "name": "probe"}]

    def turn_loss(self, model: Any, batch: Batch, turn: str) -> tuple[torch.Tensor, dict[str, float]]:
        if turn == "speaker":
            return super().loss(model, batch)
        logits = self.probe(batch.pooled.index_select(0, batch.label_image))
        rows = nn.functional.cross_entropy(logits, batch.labels[:, 0], reduction="none")
        loss = self.mean(rows, torch.ones_like(rows))  # over the global batch, as every objective under DDP
        return loss, {"probe_xe": float(loss.detach())}


def make(seed: int = 0, dropout: float = 0.0, global_sum: Any = None, world: int = 1) -> tuple[Any, TwoTurns]:
    torch.manual_seed(seed)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": dropout}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: None, max_length=6, world_size=world,
                       **({"global_sum": global_sum} if global_sum is not None else {}))
    options = TwoTurnOptions.from_dict({"lr": 1e-2, "epochs": 2, **CONSTANT_LR, "probe_lr": 5e-2}, "two_turns")
    return model, TwoTurns(options, env, model)


def values(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in before if not torch.equal(before[k], after[k])}


# --- Adam leaves a parameter without a gradient as it is ------------------------------------------
@pytest.mark.parametrize("kind", [{"fused": True}, {"foreach": True}, {"foreach": False}],
                         ids=["fused", "foreach", "for-loop"])
def test_adam_skips_a_parameter_whose_gradient_is_none(kind: dict[str, bool]) -> None:
    """The trainer's Adam (fused where torch has the kernel, as on CPU here) and its other
    implementations: a parameter with ``.grad is None`` keeps its value, its moments and its step
    count, even after steps that moved it."""
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))
    opt = torch.optim.Adam([{"params": [a]}, {"params": [b]}], lr=0.1, **kind)
    for p in (a, b):  # both move once: each has moments that would move it again
        p.grad = torch.ones(4)
    opt.step()
    b_before, b_state = b.detach().clone(), {k: v.clone() for k, v in opt.state[b].items()}
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        a.grad = torch.ones(4)
        opt.step()
    assert b.grad is None and torch.equal(b.detach(), b_before)
    assert all(torch.equal(opt.state[b][k], v) for k, v in b_state.items())
    assert int(opt.state[a]["step"]) == 4 and int(opt.state[b]["step"]) == 1


# --- the trainer --------------------------------------------------------------------------------
@pytest.mark.numerics
def test_each_turn_is_one_optimiser_step_on_its_own_parameters(tmp_path: Path) -> None:
    model, objective = make()
    trainer = toy_trainer(objective, model, tmp_path, epochs=1)
    assert trainer.optimizer.defaults["fused"] is True  # the fused kernel is the one that must skip
    changed: list[set[str]] = []
    before: dict[str, torch.Tensor] = {}

    def pre(*_: Any) -> None:
        before.clear()
        before.update({f"model.{k}": v for k, v in values(model).items()})
        before.update({f"probe.{k}": v for k, v in values(objective.probe).items()})

    def post(*_: Any) -> None:
        after = {**{f"model.{k}": v for k, v in values(model).items()},
                 **{f"probe.{k}": v for k, v in values(objective.probe).items()}}
        changed.append(moved(before, after))

    trainer.optimizer.register_step_pre_hook(pre)
    trainer.optimizer.register_step_post_hook(post)
    ids = ToyData().split_ids("train")[:8]
    _, loaded = next(iter(trainer.batches([ids])))
    metrics = trainer.step(ids, loaded)

    model_keys = {f"model.{k}" for k in model.state_dict()}
    probe_keys = {f"probe.{k}" for k in objective.probe.state_dict()}
    assert len(changed) == 2  # one optimiser step per turn
    assert changed[0] and changed[0] <= model_keys  # the speaker's turn: the caption model only
    assert changed[1] == probe_keys  # the probe's turn: the probe only
    assert set(metrics) == {"loss", "speaker/loss", "speaker/xe", "probe/loss", "probe/probe_xe"}
    assert metrics["loss"] == metrics["speaker/loss"] + metrics["probe/loss"]
    assert metrics["speaker/loss"] == metrics["speaker/xe"] and metrics["probe/loss"] == metrics["probe/probe_xe"]
    # the probe's turn ran after the speaker's update, on the same batch: its loss is the probe's on it
    batch = ToyData().batch(ids)
    state = {k.removeprefix("probe."): v for k, v in before.items() if k.startswith("probe.")}
    probe = nn.Linear(FEAT, model.vocab_size)
    probe.load_state_dict(state)
    with torch.no_grad():
        rows = nn.functional.cross_entropy(probe(batch.pooled.index_select(0, batch.label_image)),
                                           batch.labels[:, 0], reduction="none")
    # the objective's mean over the global batch against torch's: the same terms, another order
    assert abs(metrics["probe/loss"] - float(rows.mean())) <= mean_atol(len(rows), float(rows.abs().max()))


def test_a_turn_objective_counts_one_adam_step_per_turn_and_batch(tmp_path: Path) -> None:
    model, objective = make()
    trainer = toy_trainer(objective, model, tmp_path, epochs=2)
    history = fit(trainer)
    assert [h["step"] for h in history] == [2, 4]  # trainer steps count batches, not turns
    state = checkpoint.load(tmp_path / "last.pt").optimizer
    assert state is not None
    groups = state["param_groups"]
    assert [g["name"] for g in groups] == ["model", "probe"]
    steps = {int(s["step"]) for s in state["state"].values()}
    assert steps == {4}  # each parameter: one update per batch (its turn), 2 epochs x 2 batches
    assert len(state["state"]) == len(groups[0]["params"]) + len(groups[1]["params"])


def _without_seconds(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


@pytest.mark.numerics
@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_a_turn_run_stopped_and_resumed_is_bit_identical(tmp_path: Path, stop_after: int) -> None:
    """SIGTERM after the ``stop_after``-th batch (every turn of it done), then a fresh process
    state resumes: weights, optimiser states and history equal the uninterrupted run's."""
    model, objective = make(dropout=0.3)  # dropout: the turns draw from the RNG the state carries
    reference = fit(toy_trainer(objective, model, tmp_path / "reference"))
    model, objective = make(dropout=0.3)
    with sigterm_after_step(stop_after), pytest.raises(Preempted):
        fit(toy_trainer(objective, model, tmp_path / "resumed"))
    model, objective = make(seed=1, dropout=0.3)  # other weights: resume must replace them all
    trainer = toy_trainer(objective, model, tmp_path / "resumed")
    assert trainer.resume()
    assert _without_seconds(fit(trainer)) == _without_seconds(reference)
    mine = checkpoint.load(tmp_path / "resumed" / "last.pt")
    theirs = checkpoint.load(tmp_path / "reference" / "last.pt")
    for role in ("model", "probe"):
        assert all(torch.equal(v, theirs.modules[role].state[k]) for k, v in mine.modules[role].state.items())
    assert mine.optimizer is not None and theirs.optimizer is not None
    for key, state in mine.optimizer["state"].items():
        assert all(torch.equal(v, theirs.optimizer["state"][key][k]) for k, v in state.items())


# --- DDP (gloo, 2 processes) ------------------------------------------------------------------------
def _float64_toy_data() -> Any:
    """ToyData's features in float64 (the DDP comparison runs in float64: tests/numerics.py)."""
    features_of = ToyData.features_of
    return lambda self, *args: to_float64(*features_of(self, *args))


def _ddp_worker(state_dir: str) -> None:
    """One process of the DDP run: the same toy run, the batch split over the processes, in float64."""
    from caprl.training import distributed

    torch.set_num_threads(1)
    ToyData.features_of = _float64_toy_data()  # this worker process only
    dist = distributed.from_environment()
    model, objective = to_float64(*make(global_sum=dist.sum, world=dist.world))
    trainer = toy_trainer(objective, model, Path(state_dir), epochs=1, dist=dist)
    fit(trainer)


@pytest.mark.timeout(300)
@pytest.mark.numerics
def test_turns_under_ddp_follow_the_one_process_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP (find_unused_parameters) leaves the gradient of a parameter no turn's loss reaches at
    None, so the other turn's module is not moved by Adam's momentum: the two-process run ends
    where the one-process run does, with the same Adam step counts. Both runs in float64: the
    gradients summed over the processes add in another order (tests/numerics.py)."""
    import signal

    from caprl.training import distributed

    monkeypatch.setattr(ToyData, "features_of", _float64_toy_data())
    model, objective = to_float64(*make())
    fit(toy_trainer(objective, model, tmp_path / "one", epochs=1))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        distributed.spawn(2, _ddp_worker, str(tmp_path / "two"))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    one, two = checkpoint.load(tmp_path / "one" / "last.pt"), checkpoint.load(tmp_path / "two" / "last.pt")
    for role in ("model", "probe"):
        for key, value in one.modules[role].state.items():
            assert_float64_close(value, two.modules[role].state[key], msg=f"{role}.{key}")
    assert one.optimizer is not None and two.optimizer is not None
    assert {int(s["step"]) for s in two.optimizer["state"].values()} == {2}  # 2 batches, one turn each
    assert len(two.optimizer["state"]) == sum(len(g["params"]) for g in two.optimizer["param_groups"])  # both turns ran
    assert os.path.exists(tmp_path / "two" / "best.pt")
