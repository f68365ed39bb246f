"""The training loop shared by every objective: batches, optimiser, validation, checkpoints.

Resumable: the state file (``last.pt``) holds model, optimiser, RNG state and the
position in the data (epoch, batch), written every ``train.checkpoint_every`` steps, at
every epoch end and on SIGTERM/SIGUSR1. The order of batches is a pure function of
(seed, epoch), so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from caprl import decoding
from caprl.models import CaptionModel
from caprl.objectives import Objective
from caprl.training import checkpoint
from caprl.training.data import CaptionData
from caprl.training.distributed import Dist

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Raised after the state was saved because SLURM (or a user) asked the job to stop."""


@dataclass
class LoopConfig:
    epochs: int
    lr: float
    batch_size: int
    grad_clip: float
    checkpoint_every: int
    log_every: int
    max_length: int
    seed: int


@dataclass
class Position:
    epoch: int = 0
    batch: int = 0
    step: int = 0
    best_score: float = float("-inf")
    history: list[dict[str, Any]] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)  # losses of this epoch's steps so far


class StopFlag:
    """Turns SIGTERM/SIGUSR1 into a flag the loop checks between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        log.warning("received signal %d: saving the state and stopping after this step", signum)
        self.signum = signum


class LossModule(torch.nn.Module):
    """The objective's loss as a module's forward, so DistributedDataParallel can wrap it
    (objectives drive the model through its decoding methods, not through ``forward``)."""

    def __init__(self, model: CaptionModel, objective: Objective) -> None:
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return self.objective.loss(self.model, batch)


def epoch_order(image_ids: list[int], seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return [image_ids[i] for i in torch.randperm(len(image_ids), generator=gen).tolist()]


class Trainer:
    def __init__(
        self,
        model: CaptionModel,
        objective: Objective,
        data: CaptionData,
        config: LoopConfig,
        validate: Callable[[CaptionModel], dict[str, float]],
        state_dir: Path,
        model_meta: dict[str, Any],
        tracker: Any,
        dist: Dist | None = None,
    ) -> None:
        self.dist = dist or Dist()
        self.model, self.objective, self.data, self.config = model.to(self.dist.device), objective, data, config
        self.validate = validate
        self.state_dir = Path(state_dir)
        self.meta = model_meta
        self.tracker = tracker
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        self.pos = Position()
        self.stop = StopFlag()
        self.loss_fn: torch.nn.Module = LossModule(self.model, objective)
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
            self.loss_fn = DistributedDataParallel(self.loss_fn, device_ids=ids, find_unused_parameters=True)

    # --- state -------------------------------------------------------------------------
    def _payload(self, with_optimizer: bool) -> dict[str, Any]:
        payload = dict(self.meta)
        payload["model_state"] = self.model.state_dict()
        payload.update(epoch=self.pos.epoch, batch=self.pos.batch, step=self.pos.step,
                       best_score=self.pos.best_score, history=self.pos.history)
        if with_optimizer:
            payload["optimizer_state"] = self.optimizer.state_dict()
            payload["rng_torch"] = self.dist.gather(torch.get_rng_state())  # one state per process
            payload["mlflow_run_id"] = getattr(self.tracker, "run_id", None) or ""
            payload["epoch_losses"] = list(self.pos.epoch_losses)
        return payload

    def save_state(self) -> None:
        """Every process calls this (the RNG states are gathered); process 0 writes."""
        payload = self._payload(with_optimizer=True)
        if self.dist.main:
            checkpoint.save(self.state_dir / "last.pt", payload)
        self.dist.barrier()

    def resume(self) -> bool:
        """Load ``last.pt`` if this run left one; True if it did."""
        path = self.state_dir / "last.pt"
        if self.dist.main:  # temp files of saves cut short by a kill: never read, safe to drop
            for stale in self.state_dir.glob(".*.pt.*.tmp"):
                stale.unlink(missing_ok=True)
        if not path.exists():
            return False
        state = checkpoint.load(path, vocab_sha256=self.meta["vocab_sha256"])
        if state.get("config_hash") != self.meta["config_hash"]:
            log.warning("%s was written with other parameters: starting this run afresh", path)
            return False
        self.model.load_state_dict(state["model_state"])
        self.optimizer.load_state_dict(state["optimizer_state"])
        rng = state["rng_torch"]
        if len(rng) == self.dist.world:
            torch.set_rng_state(rng[self.dist.rank])
        else:  # resumed with another number of processes: dropout streams cannot continue
            log.warning("state saved by %d processes, resuming with %d: re-seeding dropout", len(rng), self.dist.world)
            torch.manual_seed(self.config.seed + 1000 * self.dist.rank + state["step"])
        self.pos = Position(state["epoch"], state["batch"], state["step"], state["best_score"], list(state["history"]),
                            list(state.get("epoch_losses", [])))
        log.info("resumed from %s at epoch %d, batch %d (step %d)", path, self.pos.epoch, self.pos.batch, self.pos.step)
        return True

    # --- loop --------------------------------------------------------------------------
    def fit(self, train_ids: list[int]) -> Position:
        self.stop.install()
        cfg = self.config
        n_batches = (len(train_ids) + cfg.batch_size - 1) // cfg.batch_size
        while self.pos.epoch < cfg.epochs:
            order = epoch_order(train_ids, cfg.seed, self.pos.epoch)
            started = time.time()
            bar = tqdm(total=n_batches, initial=self.pos.batch, desc=f"epoch {self.pos.epoch + 1}/{cfg.epochs}",
                       leave=False, mininterval=2.0, disable=None if self.dist.main else True)
            while self.pos.batch < n_batches:
                ids = order[self.pos.batch * cfg.batch_size : (self.pos.batch + 1) * cfg.batch_size]
                metrics = self._step(ids)
                self.pos.epoch_losses.append(metrics["loss"])
                self.pos.batch += 1
                self.pos.step += 1
                bar.update(1)
                if self.pos.step % cfg.log_every == 0:
                    self.tracker.log_metrics({f"train/{k}": v for k, v in metrics.items()}, step=self.pos.step)
                if self.dist.any(self.stop.signum is not None):
                    self.save_state()
                    raise Preempted(128 + (self.stop.signum or signal.SIGTERM))
                if self.pos.step % cfg.checkpoint_every == 0:
                    self.save_state()
            bar.close()
            self._end_epoch(list(self.pos.epoch_losses), time.time() - started)
        return self.pos

    def _step(self, image_ids: list[int]) -> dict[str, float]:
        """One optimiser step on a global batch; each process takes its block of images."""
        self.model.train()
        local, offset = self.dist.shard(image_ids)
        batch = self.data.batch(local).to(self.dist.device)
        batch.noise = decoding.Noise(self.config.seed, self.pos.step, total=len(image_ids), offset=offset)
        loss, metrics = self.loss_fn(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return self.dist.mean_metrics({"loss": float(loss.detach()), **metrics})

    def _end_epoch(self, losses: list[float], seconds: float) -> None:
        val = self.validate(self.model)  # every process computes it (same weights, same number)
        score = val["CIDEr-D"]
        train_loss = float(np.mean(losses)) if losses else float("nan")
        record = {"epoch": self.pos.epoch + 1, "step": self.pos.step, "train_loss": train_loss,
                  "step_losses": losses, "seconds": round(seconds, 2), **{f"val_{k}": v for k, v in val.items()}}
        self.pos.history.append(record)
        self.tracker.log_metrics({"val/CIDEr-D": score, "train/epoch_loss": train_loss}, step=self.pos.step)
        log.info("epoch %d: train loss %.4f, val CIDEr-D %.4f (%.1fs)", self.pos.epoch + 1, train_loss, score, seconds)
        if score > self.pos.best_score:
            self.pos.best_score = score
            if self.dist.main:
                checkpoint.save(self.state_dir / "best.pt", self._payload(with_optimizer=False))
        self.pos.epoch += 1
        self.pos.batch = 0
        self.pos.epoch_losses = []
        self.save_state()


def greedy_captions(model: CaptionModel, data: CaptionData, image_ids: list[int], max_length: int,
                    batch_size: int = 100) -> dict[int, list[str]]:
    """Greedy caption (last stage) of every image, as word lists."""
    model.eval()
    device = next(model.parameters()).device
    out: dict[int, list[str]] = {}
    with torch.no_grad():
        for i in range(0, len(image_ids), batch_size):
            ids = image_ids[i : i + batch_size]
            ctx = model.encode(*(t.to(device) for t in data.features_of(ids)))
            tokens = decoding.sample(model, ctx, max_length, greedy=True).last_stage()
            out.update(zip(ids, data.decode(tokens)))
    return out
