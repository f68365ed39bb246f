"""A toy vocabulary, hand-checkable rewards, toy data and the real trainer on it, shared by
the objective and trainer tests."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from caprl.data.batch import Batch

WORDS = ["<eos>", "a", "red", "circle", "blue", "square"]


def decode(tokens: torch.Tensor) -> list[list[str]]:
    """Token ids ``[N, T]`` -> words, up to each row's end token."""
    out = []
    for row in tokens.tolist():
        words = []
        for t in row:
            if t == 0:
                break
            words.append(WORDS[t])
        out.append(words)
    return out


def count_red(image_ids, captions) -> np.ndarray:
    """A hand-made reward: how many times 'red' was said (easy to check by hand)."""
    return np.array([c.count("red") for c in captions], dtype=np.float64)


#: the step decay switched off (``lr_decay_every``: 0): every objective's options need both keys
CONSTANT_LR = {"lr_decay_every": 0, "lr_decay_rate": 1.0}


FEAT = 5  # pooled feature size of the toy images
# the 4 kinds of toy image and their caption: "a red circle", "a red square", "a blue circle", "a blue square"
CAPTIONS = [[1, 2, 3, 0], [1, 2, 5, 0], [1, 4, 3, 0], [1, 4, 5, 0]]


class ToyData:
    """Image i is of kind i % 4 (pooled: that kind's one-hot plus noise), two gold captions each.
    Train ids 0..15, val ids 100..107."""

    def split_ids(self, split: str) -> list[int]:
        return list(range(16)) if split == "train" else list(range(100, 108))

    def features_of(self, ids: list[int], regions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        pooled, regions_ = [], []
        for i in ids:
            gen = torch.Generator().manual_seed(i)
            pooled.append(F.one_hot(torch.tensor(i % 4), FEAT).float() + 0.1 * torch.randn(FEAT, generator=gen))
            regions_.append(torch.randn(3, FEAT, generator=gen))
        return torch.stack(pooled), torch.stack(regions_)[:, : 3 if regions else 0]

    def batch(self, ids: list[int], regions: bool = True) -> Batch:
        pooled, regions_ = self.features_of(ids, regions)
        labels = torch.tensor([CAPTIONS[i % 4] for i in ids for _ in range(2)])
        return Batch(list(ids), pooled, regions_, labels, torch.arange(len(ids)).repeat_interleave(2))

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        return decode(tokens)

    def references(self, split: str) -> dict[int, list[list[str]]]:
        """Each image's two gold captions (the same sentence), tokenised (as CaptionData's)."""
        return {i: [[WORDS[t] for t in CAPTIONS[i % 4] if t]] * 2 for i in self.split_ids(split)}


class NullTracker:
    run_id = ""

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass


def greedy_reward_gain(objective: Any, model: Any, batch: Any, steps: int, lr: float = 1e-2) -> tuple[float, float]:
    """``steps`` Adam steps of ``objective`` on one toy batch: the greedy caption's reward at the
    first step and at the last (the objectives' "it learns the toy reward" checks)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    first = last = None
    for _ in range(steps):
        loss, metrics = objective.loss(model, batch)
        first = metrics["reward_greedy"] if first is None else first
        last = metrics["reward_greedy"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return first, last


def toy_trainer(objective: Any, model: Any, state_dir: Path, epochs: int = 2,
                validate: Callable[[Any], dict[str, float]] | None = None,
                init: dict[str, str] | None = None, dist: Any = None, cuda_graphs: bool = False,
                batch_size: int = 8) -> Any:
    """The real trainer on the toy data (8 images a batch: 2 steps an epoch); ``init``: the
    run's init roles (a run with one validates its starting weights as epoch 0); ``dist``: its
    process group (default: one process)."""
    from caprl.training.loop import LoopConfig, RunMeta, Trainer

    loop = LoopConfig(epochs=epochs, batch_size=batch_size, grad_clip=2.0,
                      checkpoint_every=100, log_every=100, max_length=6, seed=0, cuda_graphs=cuda_graphs)
    meta = RunMeta(arch="fc", run={"name": objective.name, "method": objective.name, "init": dict(init or {})},
                   vocab_sha256="toy", config_hash=objective.name)
    return Trainer(model, objective, ToyData(), loop, validate or (lambda m: {"CIDEr-D": 0.0}), state_dir, meta,
                   NullTracker(), dist)


def fit(trainer: Any) -> list[dict[str, Any]]:
    """``trainer.fit`` on the toy train split, this process's signal handlers restored after."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        return trainer.fit(ToyData().split_ids("train")).history
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def record_step_inputs(model: Any) -> list[torch.Tensor]:
    """Wrap the model's ``step`` so every call records the words (ids or rows) it reads."""
    seen: list[torch.Tensor] = []
    real = model.step

    def step(words: torch.Tensor, ctx: Any, state: Any) -> Any:
        seen.append(words)
        return real(words, ctx, state)

    model.step = step
    return seen


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    """Every tensor of the module's state equals the snapshot's."""
    return all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


def ending_model(arch: str) -> Any:
    """A small ``arch`` model (dropout 0.5) whose end token is likely at every step: captions of every length."""
    from caprl.models import MODELS, build_model

    torch.manual_seed(0)
    fields = MODELS.get(arch).config_class.__dataclass_fields__
    options = {k: v for k, v in {"embed_size": 16, "hidden_size": 32, "att_hidden_size": 16}.items() if k in fields}
    model = build_model(arch, {**options, "dropout": 0.5}, 12, 8, 4)
    for name, p in model.named_parameters():
        if name.endswith("bias") and p.shape[0] == 12:
            with torch.no_grad():
                p[0] += 2.0
    return model


def rescoring_case(arch: str) -> tuple[Any, Any]:
    """For the tests that re-score sampled captions teacher-forced: a float64 ``arch`` model in eval
    mode whose captions end at every length (:func:`ending_model`; the transformer a small one,
    dropout 0) and a batch of 3 images (``pooled``, ``regions``, ``image_ids``), drawn after seed 3."""
    import dataclasses

    from caprl.models import build_model
    from numerics import to_float64

    model = ending_model(arch) if arch != "transformer" else build_model(
        "transformer", {"num_layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "dropout": 0.0, "feat_dropout": 0.0,
                        "max_positions": 9}, 12, 8, 4)
    model = to_float64(model).eval()
    torch.manual_seed(3)
    pooled, regions = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    return model, dataclasses.make_dataclass("B", ["pooled", "regions", "image_ids"])(pooled, regions, [0, 1, 2])


def reward_trace(objective: Any, model: Any, batch: Any, steps: int, key: str,
                 optimizer: torch.optim.Optimizer) -> tuple[list[float], dict[str, float]]:
    """``steps`` batches of ``objective`` on one toy batch from ``torch.manual_seed(0)``, each an
    optimiser update per turn (one for a method without turns): metric ``key`` after each batch,
    and the last update's metrics (the objectives' "it learns the toy reward" checks)."""
    torch.manual_seed(0)
    values: list[float] = []
    metrics: dict[str, float] = {}
    for _ in range(steps):
        for turn in objective.turns or (None,):
            loss, metrics = objective.loss(model, batch) if turn is None else objective.turn_loss(model, batch, turn)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        values.append(metrics[key])
    return values, metrics
