"""Best-epoch selection scores the starting point: a run that starts from other runs' weights
(an ``init``) validates them first, as epoch 0, and keeps them unless a trained epoch beats
them; runs from scratch are unchanged. The real trainer and the real validator (validation
CIDEr-D of the run's evaluation decoding, :func:`caprl.training.run.make_validator`) on the toy
data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from caprl import params as params_mod
from caprl.models import checkpoint
from caprl.models import build_model
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.objectives.xe import CrossEntropy
from caprl.errors import CaprlError
from caprl.evaluation.run import decoded_captions
from caprl.rewards import build_reward, compute_document_frequencies
from caprl.training.run import history_json, load_inits, make_validator
from caprl.training.settings import TrainSettings
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, decode, fit, toy_trainer

XE = {"lr": 5e-2, "epochs": 6, **CONSTANT_LR}


class Unlearn(CrossEntropy):
    """Gradient ascent on the gold captions' cross-entropy: a loss whose every step makes the
    captions worse (what a diverging RL run does to its XE start)."""

    name = "unlearn"

    def loss(self, model: Any, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().loss(model, batch)
        return -loss, metrics


def make(seed: int = 0) -> tuple[Any, ObjectiveEnv]:
    torch.manual_seed(seed)
    # the toy runs below were laid out on the tanh cell (a diverging run's epochs all below its start)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0, "cell": "lstm"}, len(WORDS), FEAT, 3)
    return model, ObjectiveEnv(decode_words=decode, reward=lambda name: None, max_length=6)


def validator() -> Any:
    return make_validator(ToyData(), beam_size=1, max_length=6)  # type: ignore[arg-type]  # toy data: what it reads


def model_state(path: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(path).module("model").state


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def xe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XE run from scratch that learns the toy captions; its state directory."""
    out = tmp_path_factory.mktemp("xe")
    model, env = make()
    objective = build_objective("xe", XE, env, model)
    fit(toy_trainer(objective, model, out, epochs=XE["epochs"], validate=validator()))
    return out


def test_a_run_from_scratch_has_no_epoch_0(xe_run: Path) -> None:
    position = checkpoint.load(xe_run / "last.pt").position
    history = position["history"]
    assert [h["epoch"] for h in history] == list(range(1, XE["epochs"] + 1))
    assert not any("start" in h for h in history)
    scores = [h["val_CIDEr-D"] for h in history]
    assert scores[-1] > 0.5  # it learnt the captions: a start worth keeping below
    assert position["best_epoch"] == 1 + scores.index(max(scores))
    assert checkpoint.load(xe_run / "best.pt").position["best_epoch"] == position["best_epoch"]


def test_a_run_whose_training_only_hurts_keeps_its_start(xe_run: Path, tmp_path: Path) -> None:
    """Every trained epoch is worse than the XE weights it starts from: best.pt is the start
    (epoch 0), bit for bit the init weights, and history.json names epoch 0."""
    model, env = make(seed=1)
    objective = Unlearn(CrossEntropy.Options.from_dict(XE, "unlearn"), env, model)
    init = str(xe_run / "best.pt")
    load_inits({"model": model}, {"model": init}, {"model": "fc-xe"}, "fc-unlearn", "toy")
    trainer = toy_trainer(objective, model, tmp_path, epochs=3, validate=validator(), init={"model": "fc-xe"})
    history = fit(trainer)

    start = history[0]
    assert {k: start[k] for k in ("epoch", "step", "train_loss", "step_losses", "start")} == {
        "epoch": 0, "step": 0, "train_loss": None, "step_losses": [], "start": True}
    assert start["val_CIDEr-D"] == checkpoint.load(xe_run / "best.pt").position["best_score"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3] and all(math.isfinite(h["train_loss"]) for h in history[1:])
    assert all(h["val_CIDEr-D"] < start["val_CIDEr-D"] for h in history[1:])
    assert trainer.pos.best_epoch == 0 and trainer.pos.best_score == start["val_CIDEr-D"]
    best = checkpoint.load(tmp_path / "best.pt")
    assert best.position["best_epoch"] == 0 and best.position["epoch"] == 0
    assert same_state(best.module("model").state, model_state(xe_run / "best.pt"))
    assert not same_state(model_state(tmp_path / "last.pt"), model_state(xe_run / "best.pt"))  # it did train
    assert history_json("fc-unlearn", trainer.pos)["best_epoch"] == 0


def test_an_epoch_that_beats_the_start_is_selected(tmp_path: Path) -> None:
    """XE from untrained weights given as an init: the start is validated (epoch 0), and the
    best trained epoch, which beats it, is the one kept."""
    model, env = make(seed=2)
    objective = build_objective("xe", XE, env, model)
    start_weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = toy_trainer(objective, model, tmp_path, epochs=4, validate=validator(), init={"model": "random"})
    history = fit(trainer)
    scores = [h["val_CIDEr-D"] for h in history]
    assert history[0]["start"] and max(scores[1:]) > scores[0]
    best_epoch = scores.index(max(scores))  # the first of equals, as the trainer (a strict >)
    assert best_epoch > 0 and trainer.pos.best_epoch == best_epoch
    best = checkpoint.load(tmp_path / "best.pt")
    assert best.position["best_epoch"] == best_epoch and best.position["history"] == history[: best_epoch + 1]
    assert not same_state(best.module("model").state, start_weights)


def test_the_start_is_validated_once_not_again_on_resume(xe_run: Path, tmp_path: Path) -> None:
    """The start's score is part of the saved position: a run resumed after it does not
    validate the starting weights again (they are no longer the weights it holds)."""
    model, env = make(seed=1)
    objective = Unlearn(CrossEntropy.Options.from_dict(XE, "unlearn"), env, model)
    load_inits({"model": model}, {"model": str(xe_run / "best.pt")}, {"model": "fc-xe"}, "fc-unlearn", "toy")
    fit(toy_trainer(objective, model, tmp_path, epochs=1, validate=validator(), init={"model": "fc-xe"}))
    saved = checkpoint.load(tmp_path / "last.pt").position
    model, env = make(seed=3)
    objective = Unlearn(CrossEntropy.Options.from_dict(XE, "unlearn"), env, model)
    trainer = toy_trainer(objective, model, tmp_path, epochs=2, validate=validator(), init={"model": "fc-xe"})
    assert trainer.resume()
    history = fit(trainer)
    assert [h["epoch"] for h in history] == [0, 1, 2] and history[:2] == saved["history"]


def test_mlflow_sync_logs_a_history_record_under_the_trainers_keys() -> None:
    """``caprl mlflow-sync`` replays history.json: epoch 0 has no training loss and its
    ``start`` flag is no metric; an epoch's ``lr`` is ``train/lr`` as the trainer logs it."""
    from caprl.workflow.mlflow_sync import epoch_metrics

    start = {"epoch": 0, "step": 0, "train_loss": None, "step_losses": [], "start": True, "seconds": 0.2,
             "val_CIDEr-D": 0.5}
    assert epoch_metrics(start) == {"seconds": 0.2, "val/CIDEr-D": 0.5}
    epoch = {"epoch": 1, "step": 2, "train_loss": 1.5, "lr": 1e-3, "step_losses": [1.0, 2.0], "seconds": 0.3,
             "val_CIDEr-D": 0.4}
    assert epoch_metrics(epoch) == {"train/epoch_loss": 1.5, "train/lr": 1e-3, "seconds": 0.3, "val/CIDEr-D": 0.4}


def test_early_stopping_ends_a_run_patience_epochs_after_its_best(xe_run: Path, tmp_path: Path) -> None:
    """``train.patience``: a run whose epochs all fall below its start (epoch 0) stops after
    ``patience`` epochs; run again from its state, it trains no further (the stop is a function
    of the position); best.pt is the start."""
    model, env = make(seed=1)
    objective = Unlearn(CrossEntropy.Options.from_dict(XE, "unlearn"), env, model)
    load_inits({"model": model}, {"model": str(xe_run / "best.pt")}, {"model": "fc-xe"}, "fc-unlearn", "toy")
    trainer = toy_trainer(objective, model, tmp_path, epochs=XE["epochs"], validate=validator(), init={"model": "fc-xe"})
    trainer.config.patience = 2
    history = fit(trainer)
    assert [h["epoch"] for h in history] == [0, 1, 2] and XE["epochs"] > 3
    assert checkpoint.load(tmp_path / "best.pt").position["best_epoch"] == 0
    again = toy_trainer(objective, model, tmp_path, epochs=XE["epochs"], validate=validator(), init={"model": "fc-xe"})
    again.config.patience = 2
    assert [h["epoch"] for h in fit(again)] == [0, 1, 2]


def test_validation_scores_the_captions_of_the_runs_evaluation_decoding(xe_run: Path) -> None:
    """With ``beam_size`` > 1 the validator scores the best beam of evaluation's own beam search
    (``caprl evaluate``'s decoder), so a checkpoint is chosen on the decoding its row reports;
    with 1, the greedy captions."""
    model = checkpoint.model_from_checkpoint(checkpoint.load(xe_run / "best.pt")).eval()
    data = ToyData()
    refs = data.references("val")
    ids = sorted(refs)
    scorer = build_reward("cider_d", refs, compute_document_frequencies(refs))
    for method, beam in (("greedy", 1), ("beam", 3)):
        captions = decoded_captions(model, data, ids, method, 4, max_length=6, beam_size=beam)  # type: ignore[arg-type]
        want = float(scorer(ids, [captions[i].split() for i in ids]).mean())
        got = make_validator(data, beam_size=beam, max_length=6)(model)["CIDEr-D"]  # type: ignore[arg-type]
        assert got == pytest.approx(want, abs=1e-12)


def test_validation_decodes_as_the_run_is_evaluated_unless_told_greedy() -> None:
    """``train.validate_with``: ``evaluation`` (params.yaml's) takes the run's own decode (beam 5,
    paper 004's runs beam 2); ``greedy`` is self-critical.pytorch's default; anything else is named."""
    params = params_mod.load(["params.yaml"])

    def validation_decode(run: str) -> dict[str, int]:
        return TrainSettings.from_params(params, "synthetic", run).validation_decode()

    assert params["train"]["validate_with"] == "evaluation"
    assert validation_decode("fc-scst") == {"beam_size": params["decode"]["beam_size"], "max_length": 16}
    assert validation_decode("fc-luo2018-lam0_5")["beam_size"] == 2
    params["train"]["validate_with"] = "greedy"
    assert validation_decode("fc-scst") == {"beam_size": 1, "max_length": 16}
    params["train"]["validate_with"] = "beam"
    with pytest.raises(CaprlError, match="train.validate_with"):
        validation_decode("fc-scst")
