"""The toy world of the paper-004 objective tests: four kinds of image with one caption each,
a tiny Show-Tell speaker and listener, and recorders of what an objective decodes, scores and
passes to its listener (real components, wrapped only to record their inputs)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.models import build_model
from caprl.objectives import Batch, Objective, ObjectiveEnv, build_objective
from caprl.retrieval import ListenerConfig
from numerics import summation_atol
from toy import CAPTIONS, CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, same, snapshot  # noqa: F401 (re-exported)

CONFIG = ListenerConfig(word_size=8, hidden_size=12, margin=0.2)

BASE = {"lr": 1e-2, "epochs": 1, **CONSTANT_LR}
JOINT = {**BASE, "lam": 0.5, "n_samples": 2, "reward": "count_red"}
TRAINED = {**JOINT, "listener_lr": 1e-2}
ST = {**TRAINED, "tau": 1.0}
PSST = {**ST, "rho": 0.5, "variant": "paper"}
OPTIONS: dict[str, dict[str, Any]] = {
    "listener": {**BASE, "warmup_epochs": 1}, "luo2018": JOINT, "reinforce_joint": TRAINED, "st_gumbel": ST, "st_multinomial": ST,
    "psst_gumbel": PSST, "psst_multinomial": PSST, "frozen_speaker": {**BASE, "n_samples": 2}}


def make_env(**extras: Any) -> ObjectiveEnv:
    extras = {"listener": CONFIG, "feat_dim": FEAT, "seed": 0, **extras}
    return ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6, extras=extras)


def make(method: str, options: dict[str, Any] | None = None, seed: int = 0) -> tuple[Any, Objective, Batch]:
    torch.manual_seed(seed)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0, "cell": "lstm"}, len(WORDS), FEAT,
                        3)  # the toy speaker the tests were laid out on (the tanh cell)
    objective = build_objective(method, {**OPTIONS[method], **(options or {})}, make_env(), model)
    batch = ToyData().batch([0, 1, 2, 3])
    batch.noise = decoding.Noise(seed=0, step=0, total=4)
    return model, objective, batch


def record_listener_inputs(objective: Objective) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Wrap the objective's listener so every ``similarity`` call records its caption input."""
    calls: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    real = objective.listener.similarity

    def similarity(captions: torch.Tensor, pooled: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        calls.append((captions, lengths))
        return real(captions, pooled, lengths)

    objective.listener.similarity = similarity  # type: ignore[method-assign]
    return calls


def record_decodes(objective: Objective) -> list[tuple[decoding.Samples, ...]]:
    """Wrap a straight-through objective's decode so every call records (greedy, samples, l_nat's samples)."""
    drawn: list[tuple[decoding.Samples, ...]] = []
    real = objective.decode

    def decode_and_record(model: Any, batch: Batch) -> tuple[decoding.Samples, ...]:
        drawn.append(real(model, batch))
        return drawn[-1]

    objective.decode = decode_and_record  # type: ignore[method-assign]
    return drawn


def is_one_hot(rows: torch.Tensor) -> bool:
    """Every row of ``rows [..., V]`` is a one-hot vector, up to the rounding of ST's h - p + p: a
    sum of 3 terms of at most 1 (tests/numerics.py)."""
    hard = F.one_hot(rows.detach().argmax(-1), rows.shape[-1]).to(rows.dtype)
    return bool(torch.allclose(rows.detach(), hard, atol=summation_atol(3, 1.0, rows.dtype), rtol=0))


def grad_sum(module: torch.nn.Module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)
