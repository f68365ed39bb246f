"""An objective's own modules: optimised at their own learning rate, checkpointed, and the
objective's validation metric picks the best epoch (a non-captioner method, as a listener's
pre-training will be)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch import nn

from conftest import TINY, default_params, merge
from pipeline_data import DatasetPaths, build_dataset
from toy import CONSTANT_LR

from caprl.models.base import CaptionModel
from caprl.objectives import OBJECTIVES, Batch, Objective, Options, register_objective

NAME = "test_probe"


@dataclass
class ProbeOptions(Options):
    probe_lr: float


class ImageProbe(Objective):
    """Predicts each image's first caption word from its pooled features; the caption model is
    frozen (it has no optimiser group). Validation: the probe's accuracy on the val images."""

    Options = ProbeOptions
    options: ProbeOptions
    captioner = False
    select = "probe_accuracy"

    def __init__(self, options: ProbeOptions, env: Any, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.probe = nn.Linear(model.feat_dim, model.vocab_size)

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return [{"params": list(self.probe.parameters()), "lr": self.options.probe_lr, "name": "probe"}]

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        logits = self.probe(batch.pooled.index_select(0, batch.label_image))
        loss = nn.functional.cross_entropy(logits, batch.labels[:, 0])
        return loss, {"probe_loss": float(loss.detach())}

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        ids = data.split_ids("val")
        batch = data.batch(ids)
        with torch.no_grad():
            guess = self.probe(batch.pooled.index_select(0, batch.label_image)).argmax(-1)
        return {"probe_accuracy": float((guess == batch.labels[:, 0]).float().mean())}


@pytest.fixture(scope="module")
def probe_registered() -> Iterator[None]:
    register_objective(NAME)(ImageProbe)
    try:
        yield
    finally:
        OBJECTIVES._entries.pop(NAME)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, probe_registered: None) -> DatasetPaths:
    work = tmp_path_factory.mktemp("probe")
    params = merge(default_params(), TINY)
    params["synthetic"]["n_train"] = 40
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    return build_dataset(work, params, env=env)


def test_objective_modules_train_alone_and_select_the_best_epoch(dataset: DatasetPaths, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl import params as params_mod
    from caprl.models import checkpoint
    from caprl.data.loader import CaptionData, DataPaths
    from caprl.training import run as run_mod

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(dataset.workdir)
    params = params_mod.load(dataset.params)
    params["objectives"][NAME] = {"lr": 1e-3, "epochs": 3, **CONSTANT_LR, "probe_lr": 5e-2}
    params["runs"] = {"fc-probe": {"method": NAME, "model": "fc"}}
    data = CaptionData(DataPaths(str(dataset.annotations), str(dataset.vocab), str(dataset.labels),
                                 str(dataset.features)))
    best, position = run_mod.train(params, "synthetic", "fc-probe", data, str(dataset.cider_df), {}, tmp_path / "s")
    history = position.history

    assert [sorted(k for k in h if k.startswith("val_")) for h in history] == [["val_probe_accuracy"]] * 3
    scores = [h["val_probe_accuracy"] for h in history]
    ckpt, last = checkpoint.load(best), checkpoint.load(tmp_path / "s" / "last.pt")
    assert ckpt.position["select"] == "probe_accuracy" and ckpt.position["best_score"] == max(scores)
    assert set(ckpt.modules) == {"model", "probe"} and ckpt.modules["probe"].arch == f"{NAME}.probe"
    assert last.optimizer is not None and [g["lr"] for g in last.optimizer["param_groups"]] == [5e-2]
    # the caption model had no optimiser group: its weights are the same in every checkpoint
    assert all(torch.equal(ckpt.modules["model"].state[k], v) for k, v in last.modules["model"].state.items())


def test_every_method_declares_the_modules_it_builds() -> None:
    """``Objective.holds`` (what the plan and the stages check init roles and decoders against,
    :mod:`caprl.objectives.run_checks`) and ``keeps`` (frozen modules of its own, never an init) are
    exactly what each registered method's objective checkpoints."""
    from caprl.models import build_model
    from caprl.objectives import ObjectiveEnv, build_objective
    from caprl.retrieval import ListenerConfig
    from toy import FEAT, WORDS, count_red, decode

    params = default_params()
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6,
                       extras={"listener": ListenerConfig.from_dict(params["listener"]), "feat_dim": FEAT,
                               "seed": 0, "steps_per_epoch": 2})
    built = {name: build_objective(name, dict(params["objectives"].get(name, {})), env, model, where=name)
             for name in OBJECTIVES if name != NAME}
    assert {name: sorted(o.modules_to_save()) for name, o in built.items()} == \
        {name: sorted(type(o).holds + o.keeps) for name, o in built.items()}
    assert {name for name, o in built.items() if o.keeps} == {"grpo", "dico", "ppo_kl"}  # a reference policy
    assert {name for name, o in built.items() if "value" in type(o).holds} == {"actor_critic", "value"}
