"""Where a run with an init starts its Adam (option ``init_optimizer``, caprl.objectives.init_optimizer):
``carry`` takes the moments and step count of the init checkpoint's same-named group (best.pt keeps the
optimiser state for it) under this run's own rates, betas and eps; ``fresh`` starts empty, as caprl did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from caprl.errors import CaprlError
from caprl.models import build_model, checkpoint
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.objectives.init_optimizer import INIT_OPTIMIZERS, carry
from conftest import default_params
from pipeline_data import DatasetPaths
from stage_inputs import caprl, degenerate_checkpoint, user_error, write_params
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, fit, toy_trainer

SCST = {"lr": 6e-4, "epochs": 1, **CONSTANT_LR, "n_samples": 2, "reward": "count_red", "temperature": 1.0,
        "entropy": 0.0, "adam_beta2": 0.98}


def env() -> ObjectiveEnv:
    return ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)


def fc(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.2}, len(WORDS), FEAT, 3)


@pytest.fixture(scope="module")
def xe_best(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy XE run's best.pt (2 epochs of 2 steps; lr 3e-3)."""
    state = tmp_path_factory.mktemp("xe")
    model = fc()
    objective = build_objective("xe", {"lr": 3e-3, "epochs": 2, **CONSTANT_LR}, env(), model)
    fit(toy_trainer(objective, model, state, epochs=2))
    return state / "best.pt"


def rl_trainer(tmp_path: Path, xe_best: Path, how: str) -> Any:
    model = fc(seed=1)
    model.load_state_dict(checkpoint.load(xe_best).module("model").state)
    objective = build_objective("scst", {**SCST, "init_optimizer": how}, env(), model)
    trainer = toy_trainer(objective, model, tmp_path / how, epochs=1, init={"model": "fc-xe"})
    trainer.start_optimizer({"model": str(xe_best)})
    return trainer


def test_best_pt_holds_the_optimiser_state(xe_best: Path) -> None:
    saved = checkpoint.load(xe_best).optimizer
    assert saved is not None and [g["name"] for g in saved["param_groups"]] == ["model"]
    assert {int(s["step"]) for s in saved["state"].values()} == {2}  # its best epoch's: the first (a tie keeps it)
    assert checkpoint.load(xe_best).rng is None  # the resume state stays last.pt's


def test_carry_takes_the_init_runs_moments_under_this_runs_rates(tmp_path: Path, xe_best: Path) -> None:
    saved = checkpoint.load(xe_best).optimizer
    assert saved is not None
    trainer = rl_trainer(tmp_path, xe_best, "carry")
    group = trainer.optimizer.param_groups[0]
    assert group["lr"] == 6e-4 and group["betas"] == (0.9, 0.98)  # this run's, not the XE run's 3e-3, 0.999
    assert len(trainer.optimizer.state) == len(group["params"])
    for index, p in enumerate(group["params"]):
        mine, theirs = trainer.optimizer.state[p], saved["state"][index]
        assert set(mine) == set(theirs)
        assert all(torch.equal(mine[k].cpu(), theirs[k]) for k in theirs)
    fit(trainer)
    assert {int(s["step"]) for s in trainer.optimizer.state.values()} == {2 + 2}  # goes on from the XE count


def test_fresh_starts_empty_and_the_first_step_differs(tmp_path: Path, xe_best: Path) -> None:
    fresh = rl_trainer(tmp_path, xe_best, "fresh")
    assert len(fresh.optimizer.state) == 0
    carried = rl_trainer(tmp_path, xe_best, "carry")
    ids = ToyData().split_ids("train")[:8]
    for trainer in (fresh, carried):
        torch.manual_seed(0)
        trainer.step(ids, trainer._load(ids))
    moved = [not torch.equal(a, b) for a, b in zip(fresh.model.parameters(), carried.model.parameters())]
    assert any(moved)


def optimizer(*names: str) -> torch.optim.Adam:
    torch.manual_seed(0)
    groups = [{"params": [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))], "lr": 0.1,
               "name": name} for name in names]
    return torch.optim.Adam(groups)


def stepped(*names: str) -> dict[str, Any]:
    """The state dict of an Adam over ``names`` groups after one step."""
    opt = optimizer(*names)
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    opt.step()
    return opt.state_dict()


def test_carry_fills_only_the_groups_of_init_roles_trained_at_the_source() -> None:
    mine = optimizer("model", "baseline", "listener")  # baseline: no init; listener: frozen at the source
    saved = stepped("model")
    carried = carry(mine, {"model": "xe.pt", "listener": "xe.pt"}, lambda path: saved)
    assert carried == ["model"]
    filled = [p for g in mine.param_groups if g["name"] == "model" for p in g["params"]]
    assert set(mine.state) == set(filled)
    assert INIT_OPTIMIZERS["fresh"](mine, {"model": "xe.pt"}, lambda path: saved) == []


def test_carry_refuses_a_checkpoint_without_state_or_of_other_parameters() -> None:
    with pytest.raises(CaprlError, match="old.pt holds no optimiser state.*init_optimizer: fresh"):
        carry(optimizer("model"), {"model": "old.pt"}, lambda path: None)
    other = stepped("model")
    other["param_groups"][0]["params"] = other["param_groups"][0]["params"][:1]
    with pytest.raises(CaprlError, match="other.pt: its optimiser group 'model' has 1 parameters"):
        carry(optimizer("model"), {"model": "other.pt"}, lambda path: other)
    swapped = stepped("model")
    swapped["state"][0], swapped["state"][1] = swapped["state"][1], swapped["state"][0]
    with pytest.raises(CaprlError, match="moments of group 'model' have shape"):
        carry(optimizer("model"), {"model": "swapped.pt"}, lambda path: swapped)


def test_params_yaml_defaults_follow_each_papers_code() -> None:
    objectives = default_params()["objectives"]
    fresh = {"sll", "sll_sle"}  # caption_competition restores the model variables only
    assert {m for m, o in objectives.items() if o["init_optimizer"] == "fresh"} == fresh
    assert {o["init_optimizer"] for m, o in objectives.items() if m not in fresh} == {"carry"}
    with pytest.raises(CaprlError, match="init_optimizer"):
        build_objective("scst", {**SCST, "init_optimizer": "warm"}, env(), fc(), where="runs.x")


def test_a_carry_from_a_checkpoint_without_optimiser_state_fails_before_the_run_writes_anything(
        research_dataset: DatasetPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """``caprl train`` of an scst run (init_optimizer: carry) from a best.pt that holds no optimiser state:
    refused, naming the file, before its MLflow run opens: no mlflow.db, no state, no checkpoint."""
    dataset, work = research_dataset, research_dataset.workdir / "carry-without-state"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    params = yaml.safe_load(dataset.params.read_text())
    assert params["objectives"]["scst"]["init_optimizer"] == "carry"
    params["runs"]["fc-scst"]["options"].pop("init_optimizer")  # research_dataset's fresh: scst's own, carry
    start = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", work / "fc-xe.pt")  # no optimiser state in it
    out = work / "out"
    proc = caprl("train", write_params(work, params), "--dataset", "synthetic", "--run", "fc-scst",
                 *dataset.train_args(), "--init", f"model={start}", "--checkpoint", out / "best.pt",
                 "--history", out / "history.json", "--state-dir", out / "state", cwd=dataset.workdir)
    assert f"{start} holds no optimiser state" in user_error(proc, "train")
    assert not (work / "mlflow.db").exists()
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
