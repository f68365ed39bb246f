"""The training loop shared by every objective: batches, optimiser, validation, checkpoints.

Resumable: the state file (``last.pt``) holds model, optimiser, RNG state and the
position in the data (epoch, batch), written every ``train.checkpoint_every`` steps, at
every epoch end and on SIGTERM/SIGUSR1. The order of batches is a pure function of
(seed, epoch), so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from caprl import checkpoint, decoding
from caprl.errors import CaprlError
from caprl.models import CaptionModel, timeshared
from caprl.objectives import Objective
from caprl.data.batch import Batch
from caprl.data.loader import CaptionData
from caprl.data.prefetch import Prefetcher
from caprl.training.distributed import Dist

log = logging.getLogger(__name__)


@dataclass
class RunMeta:
    """What a run's checkpoints record besides the weights."""

    arch: str  # the caption model's architecture
    run: dict[str, Any]  # the run's spec (method, model, options, init, datasets)
    vocab_sha256: str
    config_hash: str


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
    amp: str = "none"  # "bf16": the loss under bfloat16 autocast (weights, optimiser and rewards stay float32)
    prefetch: int = 2  # batches read ahead by a background thread


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


def _fused_adam(groups: list[dict[str, Any]], device: torch.device) -> bool | None:
    """Adam's fused kernel where torch has one for these parameters (float32 on CPU and CUDA)."""
    params = [p for g in groups for p in g["params"]]
    ok = device.type in ("cpu", "cuda") and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16)
                                                 for p in params)
    return True if ok else None


def epoch_order(image_ids: list[int], seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return [image_ids[i] for i in torch.randperm(len(image_ids), generator=gen).tolist()]


class Trainer:
    """Optimises the caption model and every module its objective brings, on ``dist.device``."""

    def __init__(
        self,
        model: CaptionModel,
        objective: Objective,
        data: CaptionData,
        config: LoopConfig,
        validate: Callable[[CaptionModel], dict[str, float]],
        state_dir: Path,
        meta: RunMeta,
        tracker: Any,
        dist: Dist | None = None,
    ) -> None:
        self.dist = dist or Dist()
        self.model, self.objective, self.data, self.config = model, objective, data, config
        self.validate = validate
        self.state_dir = Path(state_dir)
        self.meta = meta
        self.tracker = tracker
        self.loss_fn: torch.nn.Module = LossModule(self.model, objective).to(self.dist.device)
        self.modules: dict[str, torch.nn.Module] = {checkpoint.MODEL: model, **objective.modules_to_save()}
        groups = objective.param_groups(model)
        # one fused kernel per step instead of a loop over parameters (torch keeps each group's
        # "name" in its state)
        self.optimizer = torch.optim.Adam(groups, fused=_fused_adam(groups, self.dist.device))
        self.clipped = [g["params"] for g in groups]  # each module clipped on its own
        self.pos = Position()
        self.stop = StopFlag()
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
            self.loss_fn = DistributedDataParallel(self.loss_fn, device_ids=ids, find_unused_parameters=True)

    # --- state -------------------------------------------------------------------------
    def _checkpoint(self, with_state: bool) -> checkpoint.Checkpoint:
        records = {checkpoint.MODEL: checkpoint.model_record(self.model, self.meta.arch)}
        for name, module in self.objective.modules_to_save().items():
            records[name] = checkpoint.record_of(module, f"{self.objective.name}.{name}",
                                                 dataclasses.asdict(self.objective.options))
        position = {"epoch": self.pos.epoch, "batch": self.pos.batch, "step": self.pos.step,
                    "best_score": self.pos.best_score, "select": self.objective.select, "history": self.pos.history}
        ckpt = checkpoint.Checkpoint(run=self.meta.run, modules=records, vocab_sha256=self.meta.vocab_sha256,
                                     config_hash=self.meta.config_hash, code_version=checkpoint.code_version(),
                                     position=position)
        if with_state:
            position["epoch_losses"] = list(self.pos.epoch_losses)
            ckpt.optimizer = self.optimizer.state_dict()
            ckpt.rng = {"cpu": self.dist.gather(torch.get_rng_state())}  # one state per process
            if self.dist.device.type == "cuda":
                ckpt.rng["cuda"] = self.dist.gather(torch.cuda.get_rng_state(self.dist.device).cpu())
        ckpt.mlflow_run_id = getattr(self.tracker, "run_id", None) or ""  # evaluation nests its run under it
        return ckpt

    def save_state(self) -> None:
        """Every process calls this (the RNG states are gathered); process 0 writes."""
        ckpt = self._checkpoint(with_state=True)
        if self.dist.main:
            checkpoint.save(self.state_dir / "last.pt", ckpt)
        self.dist.barrier()

    def resume(self) -> bool:
        """Load ``last.pt`` if this run left one; True if it did."""
        path = self.state_dir / "last.pt"
        if self.dist.main:  # temp files of saves cut short by a kill: never read, safe to drop
            for stale in self.state_dir.glob(".*.pt.*.tmp"):
                stale.unlink(missing_ok=True)
        if not path.exists():
            return False
        try:
            state = checkpoint.load(path, vocab_sha256=self.meta.vocab_sha256)
        except CaprlError as exc:
            log.warning("%s cannot be resumed (%s): starting this run afresh", path, exc)
            return False
        if state.config_hash != self.meta.config_hash:
            log.warning("%s was written with other parameters: starting this run afresh", path)
            return False
        for name, module in self.modules.items():
            module.load_state_dict(state.module(name, where=str(path)).state)
        assert state.optimizer is not None and state.rng is not None
        self.optimizer.load_state_dict(state.optimizer)
        cpu, cuda = state.rng["cpu"], state.rng.get("cuda")
        if len(cpu) == self.dist.world:
            torch.set_rng_state(cpu[self.dist.rank])
            if cuda is not None and self.dist.device.type == "cuda":
                torch.cuda.set_rng_state(cuda[self.dist.rank], self.dist.device)
        else:  # resumed with another number of processes: dropout streams cannot continue
            log.warning("state saved by %d processes, resuming with %d: re-seeding dropout", len(cpu), self.dist.world)
            torch.manual_seed(self.config.seed + 1000 * self.dist.rank + state.position["step"])
        p = state.position
        self.pos = Position(p["epoch"], p["batch"], p["step"], p["best_score"], list(p["history"]),
                            list(p.get("epoch_losses", [])))
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
            todo = [order[b * cfg.batch_size : (b + 1) * cfg.batch_size] for b in range(self.pos.batch, n_batches)]
            for ids, loaded in self.batches(todo):
                metrics = self.step(ids, loaded)
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

    def batches(self, global_batches: list[list[int]]) -> Iterator[tuple[list[int], tuple[Batch, int]]]:
        """``(global ids, (this process's batch on the device, its offset))`` per batch, read ahead."""
        with Prefetcher(self._load, global_batches, depth=self.config.prefetch) as loaded:
            yield from loaded

    def _load(self, image_ids: list[int]) -> tuple[Batch, int]:
        local, offset = self.dist.shard(image_ids)  # each process reads only its block of images
        batch = self.data.batch(local)
        if self.dist.device.type == "cuda":
            return batch.pin().to(self.dist.device, non_blocking=True), offset
        return batch, offset

    def step(self, image_ids: list[int], loaded: tuple[Batch, int]) -> dict[str, float]:
        """One optimiser step on a global batch (``loaded``: this process's block, from :meth:`batches`)."""
        self.loss_fn.train()
        timeshared.reset(self.loss_fn)
        batch, offset = loaded
        batch.noise = decoding.Noise(self.config.seed, self.pos.step, total=len(image_ids), offset=offset)
        with torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.config.amp == "bf16"):
            loss, metrics = self.loss_fn(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        timeshared.check(self.loss_fn)
        if self.config.grad_clip > 0:
            for params in self.clipped:
                torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        self.optimizer.step()
        return self.dist.mean_metrics({"loss": float(loss.detach()), **metrics})

    def _end_epoch(self, losses: list[float], seconds: float) -> None:
        # every process computes it (same weights, same number): the caption metrics of a
        # captioner's method, plus whatever the objective measures of its own modules
        val = {**(self.validate(self.model) if self.objective.captioner else {}),
               **self.objective.validation(self.model, self.data)}
        select = self.objective.select
        if select not in val:
            raise CaprlError(f"objective {self.objective.name} selects epochs on '{select}', "
                             f"but validation gives {', '.join(sorted(val))}")
        score = val[select]
        train_loss = float(np.mean(losses)) if losses else float("nan")
        record = {"epoch": self.pos.epoch + 1, "step": self.pos.step, "train_loss": train_loss,
                  "step_losses": losses, "seconds": round(seconds, 2), **{f"val_{k}": v for k, v in val.items()}}
        self.pos.history.append(record)
        self.tracker.log_metrics({**{f"val/{k}": v for k, v in val.items()}, "train/epoch_loss": train_loss},
                                 step=self.pos.step)
        log.info("epoch %d: train loss %.4f, val %s %.4f (%.1fs)", self.pos.epoch + 1, train_loss, select, score, seconds)
        if score > self.pos.best_score:
            self.pos.best_score = score
            if self.dist.main:
                checkpoint.save(self.state_dir / "best.pt", self._checkpoint(with_state=False))
        self.pos.epoch += 1
        self.pos.batch = 0
        self.pos.epoch_losses = []
        self.save_state()


def greedy_captions(model: CaptionModel, data: CaptionData, image_ids: list[int], max_length: int,
                    batch_size: int = 100) -> dict[int, list[str]]:
    """Greedy caption (last stage) of every image, as word lists."""
    out: dict[int, list[str]] = {}
    for ids, tokens in decoding.decode_split(model, data.features_of, image_ids,
                                             lambda m, ctx: decoding.greedy_decoder(m, ctx, max_length),
                                             batch_size, desc="validation"):
        out.update(zip(ids, data.decode(tokens[:, 0])))
    return out
