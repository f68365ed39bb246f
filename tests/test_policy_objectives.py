"""GRPO, PPO-KL and DiCO in the real trainer: a run stopped after any batch and resumed in a fresh
state ends bit-identical to the uninterrupted one (the reference policy, the value head and the KL
controller come back from the checkpoint), and two DDP processes (gloo, float64) end where one
process does."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from caprl.models import build_model, checkpoint
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.training.loop import Preempted
from conftest import sigterm_after_step
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, fit, toy_trainer

BASE = {"lr": 1e-2, "epochs": 2, **CONSTANT_LR, "reward": "count_red"}
OPTIONS = {
    "grpo": {**BASE, "n_samples": 3, "scale_rewards": "batch", "loss_type": "grpo", "epsilon": 0.2,
             "epsilon_high": 0.3, "num_iterations": 2, "beta": 0.1},
    "ppo_kl": {**BASE, "n_samples": 3, "kl_coef": 0.1, "kl_target": 1.0, "kl_horizon": 50, "noptepochs": 2,
               "cliprange": 0.2, "cliprange_value": 0.2, "vf_coef": 0.1, "gamma": 1.0, "lam": 0.95,
               "whiten_rewards": True},
    "dico": {**BASE, "candidates": 3, "beta": 0.2, "tau": 1.0, "candidate_mode": "train"},
}
ROLES = {"grpo": ("model", "reference"), "ppo_kl": ("model", "reference", "value_head", "kl_controller"),
         "dico": ("model", "reference")}


def make(method: str, seed: int = 0, dropout: float = 0.0, global_sum: Any = None, world: int = 1) -> tuple[Any, Any]:
    """A toy fc model and ``method``'s objective on it, its reference taken (``begin``) from the model."""
    torch.manual_seed(seed)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": dropout}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6, world_size=world,
                       **({"global_sum": global_sum} if global_sum is not None else {}))
    objective = build_objective(method, OPTIONS[method], env, model, where=method)
    objective.begin(model)
    return model, objective


def _without_seconds(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


def assert_same_state(mine: Path, theirs: Path, roles: tuple[str, ...], close: bool = False) -> None:
    a, b = checkpoint.load(mine), checkpoint.load(theirs)
    assert sorted(a.modules) == sorted(roles)
    for role in roles:
        for key, value in a.modules[role].state.items():
            if close:
                assert_float64_close(value, b.modules[role].state[key], msg=f"{role}.{key}")
            else:
                assert torch.equal(value, b.modules[role].state[key]), f"{role}.{key}"
    assert a.optimizer is not None and b.optimizer is not None


@pytest.mark.parametrize("method", sorted(OPTIONS))
@pytest.mark.parametrize("stop_after", [1, 3])
def test_a_run_stopped_and_resumed_is_bit_identical(tmp_path: Path, method: str, stop_after: int) -> None:
    """SIGTERM after the ``stop_after``-th batch (every pass of it done), then a fresh process state
    with other weights resumes: every module (the reference, value head and KL controller included),
    the optimiser and the history equal the uninterrupted run's. Not ``numerics``: both runs replay
    the same operations in one process's kernels."""
    model, objective = make(method, dropout=0.3)  # dropout: the passes draw from the RNG the state carries
    reference = fit(toy_trainer(objective, model, tmp_path / "reference", init={"model": "xe"}))
    model, objective = make(method, dropout=0.3)
    with sigterm_after_step(stop_after), pytest.raises(Preempted):
        fit(toy_trainer(objective, model, tmp_path / "resumed", init={"model": "xe"}))
    model, objective = make(method, seed=1, dropout=0.3)  # other weights and reference: resume replaces them
    trainer = toy_trainer(objective, model, tmp_path / "resumed", init={"model": "xe"})
    assert trainer.resume()
    assert _without_seconds(fit(trainer)) == _without_seconds(reference)
    assert_same_state(tmp_path / "resumed" / "last.pt", tmp_path / "reference" / "last.pt", ROLES[method])
    mine, theirs = (checkpoint.load(tmp_path / d / "last.pt").optimizer for d in ("resumed", "reference"))
    for key, state in mine["state"].items():
        assert all(torch.equal(v, theirs["state"][key][k]) for k, v in state.items())


# --- DDP (gloo, 2 processes) ------------------------------------------------------------------------
def _float64_toy_data() -> Any:
    features_of = ToyData.features_of
    return lambda self, *args: to_float64(*features_of(self, *args))


def _ddp_worker(method: str, state_dir: str) -> None:
    from caprl.training import distributed

    torch.set_num_threads(1)
    ToyData.features_of = _float64_toy_data()  # this worker process only
    dist = distributed.from_environment()
    model, objective = make(method, global_sum=dist.sum, world=dist.world)
    model, objective = to_float64(model, objective)
    fit(toy_trainer(objective, model, Path(state_dir), epochs=1, dist=dist))


@pytest.mark.timeout(300)
@pytest.mark.numerics
@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_two_ddp_processes_end_where_one_process_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      method: str) -> None:
    """The global-batch means, the batch-wide reward scaling / whitening and the KL controller's
    global mean make the split invisible: the 2-process run's modules equal the 1-process run's
    (float64: the gradients add in another order, tests/numerics.py). Dropout 0: the processes'
    dropout streams differ by design."""
    from caprl.training import distributed

    monkeypatch.setattr(ToyData, "features_of", _float64_toy_data())
    model, objective = to_float64(*make(method))
    fit(toy_trainer(objective, model, tmp_path / "one", epochs=1))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        distributed.spawn(2, _ddp_worker, method, str(tmp_path / "two"))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert_same_state(tmp_path / "one" / "last.pt", tmp_path / "two" / "last.pt", ROLES[method], close=True)
    assert os.path.exists(tmp_path / "two" / "best.pt")
