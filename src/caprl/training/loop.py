"""The training loop shared by every objective: batches, optimiser, validation, checkpoints.

Resumable: the state file (``last.pt``) holds model, optimiser, RNG state and the
position in the data (epoch, batch), written every ``train.checkpoint_every`` steps, at
every epoch end and on SIGTERM/SIGUSR1. The order of batches and every group's learning
rate (the objective's ``lr_schedule``: the ``lr_decay_every`` / ``lr_decay_rate`` step decay, or
noam's per-step rate) are pure functions of (seed, epoch, step), so a resumed run sees exactly the
batches and rates an uninterrupted run would.

A run with an ``init`` starts its Adam as the objective's ``init_optimizer`` says
(:meth:`Trainer.start_optimizer`): empty, or carried from the init checkpoints, which is why
``best.pt`` holds the optimiser state too (not the RNG states).

Best epoch: the objective's validation metric (``select``). A run that starts from other
runs' weights (a non-empty ``init``: RL from an XE model, a value network on a frozen policy)
first validates those starting weights, before any step: the history's ``epoch`` 0 record
(``"start": true``, ``train_loss`` null), which ``best.pt`` holds until an epoch beats it, so
a run whose every epoch is worse than its start keeps its start. Runs from scratch have no
epoch 0. ``Position.best_epoch`` (0: the start) says which epoch ``best.pt`` holds.
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

from caprl import decoding
from caprl.decoding import captured
from caprl.models import checkpoint
from caprl.errors import CaprlError
from caprl.models import CaptionModel, timeshared
from caprl.objectives import Objective
from caprl.objectives.init_optimizer import INIT_OPTIMIZERS
from caprl.data.batch import Batch
from caprl.data.loader import CaptionData
from caprl.data.prefetch import Prefetcher
from caprl.training import graphs
from caprl.training.distributed import Dist

log = logging.getLogger(__name__)


@dataclass
class RunMeta:
    """What a run's checkpoints record besides the weights."""

    arch: str  # the caption model's architecture
    run: dict[str, Any]  # the run's spec (method, model, options, init, datasets)
    vocab_sha256: str
    config_hash: str
    made_from: dict[str, Any] = field(default_factory=dict)  # the data it learns from (caprl.io.provenance)


class Preempted(SystemExit):
    """Raised after the state was saved because SLURM (or a user) asked the job to stop."""


@dataclass
class LoopConfig:
    epochs: int
    batch_size: int
    grad_clip: float
    checkpoint_every: int
    log_every: int
    max_length: int
    seed: int
    amp: str = "none"  # "bf16": the loss under bfloat16 autocast (weights, optimiser and rewards stay float32)
    prefetch: int = 2  # batches read ahead by a background thread
    patience: int = 0  # early stopping: end when this many epochs in a row beat no earlier one on val (0: never)
    cuda_graphs: bool = False  # on CUDA: a fixed-shape objective's whole step as one CUDA graph (caprl.training.graphs)


@dataclass
class Position:
    epoch: int = 0
    batch: int = 0
    step: int = 0
    best_score: float = float("-inf")
    history: list[dict[str, Any]] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)  # losses of this epoch's steps so far
    best_epoch: int | None = None  # the epoch best.pt holds (0: the starting weights); None: none yet


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

    def forward(self, batch: Any, turn: str | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        if turn is None:
            return self.objective.loss(self.model, batch)
        return self.objective.turn_loss(self.model, batch, turn)


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
        self.clipped = [g["params"] for g in groups]  # each module clipped on its own
        # one fused kernel per step instead of a loop over parameters (torch keeps each group's
        # "name" in its state)
        fused = _fused_adam(groups, self.dist.device)
        captured.set_enabled(config.cuda_graphs)  # greedy decodes (SCST's baseline, validation) on a GPU
        self.graphed: graphs.GraphedStep | None = None  # the whole step as a CUDA graph, where it can be
        if (config.cuda_graphs and self.dist.device.type == "cuda" and not self.dist.active and config.amp == "none"
                and not objective.turns and type(objective).fixed_step is not Objective.fixed_step):
            self.optimizer = graphs.capturable_adam(groups, self.dist.device, fused, **objective.options.adam)
            self.graphed = graphs.graphed_step(objective, model, self.optimizer, self.clipped, config.grad_clip,
                                               self.dist.device)
        else:
            self.optimizer = torch.optim.Adam(groups, fused=fused, **objective.options.adam)
        self.base_lrs = [float(g["lr"]) for g in groups]  # each group's rate before any decay
        self.d_model: int | None = getattr(model.config, "d_model", None)  # noam's (caprl.objectives.schedules)
        self.starts_from_init = bool(meta.run.get("init"))  # validate the starting weights (epoch 0)
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
                    "best_score": self.pos.best_score, "best_epoch": self.pos.best_epoch,
                    "select": self.objective.select, "history": self.pos.history}
        ckpt = checkpoint.Checkpoint(run=self.meta.run, modules=records, vocab_sha256=self.meta.vocab_sha256,
                                     config_hash=self.meta.config_hash, code_version=checkpoint.code_version(),
                                     position=position, made_from=self.meta.made_from)
        # the optimiser state in best.pt too: a run starting from it with init_optimizer carry reads it
        ckpt.optimizer = graphs.plain_state_dict(self.optimizer)
        if with_state:
            position["epoch_losses"] = list(self.pos.epoch_losses)
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
                            list(p.get("epoch_losses", [])), p.get("best_epoch"))
        log.info("resumed from %s at epoch %d, batch %d (step %d)", path, self.pos.epoch, self.pos.batch, self.pos.step)
        return True

    def start_optimizer(self, inits: dict[str, str]) -> None:
        """A fresh run's Adam state from the checkpoints its modules start from (``inits``: role ->
        path), as the objective's option ``init_optimizer`` says (:mod:`caprl.objectives.init_optimizer`:
        ``carry`` their moments, or ``fresh``). Call it when :meth:`resume` found no state."""
        name = self.objective.options.init_optimizer
        start = INIT_OPTIMIZERS.get(name, where=f"{self.objective.name}.init_optimizer")
        carried = start(self.optimizer, dict(inits),
                        lambda path: checkpoint.load(path, vocab_sha256=self.meta.vocab_sha256).optimizer)
        if carried:
            log.info("Adam's state carried from the init checkpoints for group(s) %s", ", ".join(carried))

    # --- loop --------------------------------------------------------------------------
    def lrs(self, epoch: int, step: int) -> list[float]:
        """Every optimiser group's rate before step ``step`` (0-based) of (0-based) ``epoch``: its
        ``param_groups`` rate times the objective's schedule (a pure function of the position)."""
        scale = self.objective.options.lr_scale(epoch, step, self.d_model)
        return [base * scale for base in self.base_lrs]

    def _model_group(self) -> int:
        """The optimiser group whose rate the history records: the caption model's (``"model"``),
        else the first (a method that trains only its own modules)."""
        names = [g.get("name") for g in self.optimizer.param_groups]
        return names.index(checkpoint.MODEL) if checkpoint.MODEL in names else 0

    def fit(self, train_ids: list[int]) -> Position:
        self.stop.install()
        cfg = self.config
        n_batches = (len(train_ids) + cfg.batch_size - 1) // cfg.batch_size
        if self.starts_from_init and self.pos.step == 0 and not self.pos.history:  # fresh, not resumed
            self._score_start()
        while self.pos.epoch < cfg.epochs and not self._out_of_patience():
            order = epoch_order(train_ids, cfg.seed, self.pos.epoch)
            started = time.time()
            bar = tqdm(total=n_batches, initial=self.pos.batch, desc=f"epoch {self.pos.epoch + 1}/{cfg.epochs}",
                       leave=False, mininterval=2.0, disable=None if self.dist.main else True)
            todo = [order[b * cfg.batch_size : (b + 1) * cfg.batch_size] for b in range(self.pos.batch, n_batches)]
            for ids, loaded in self.batches(todo):
                # before every step (noam's changes at each); also after a resume (the state's rates are overwritten)
                self._set_lrs(self.lrs(self.pos.epoch, self.pos.step))
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

    def _set_lrs(self, lrs: list[float]) -> None:
        """Every group's rate; a graphed step reads each rate from a device tensor, written in place."""
        for group, lr in zip(self.optimizer.param_groups, lrs):
            if self.graphed is not None and not isinstance(group["lr"], torch.Tensor):  # a resume loaded floats
                group["lr"] = torch.tensor(lr, device=self.dist.device)
            graphs.set_lr(group, lr)

    def _out_of_patience(self) -> bool:
        """Early stopping: ``patience`` epochs since the best (the start counts as epoch 0); a pure
        function of the position, so a resumed run stops where the uninterrupted one does."""
        best, patience = self.pos.best_epoch, self.config.patience
        if patience <= 0 or best is None or self.pos.epoch - best < patience:
            return False
        if self.pos.epoch < self.config.epochs:
            log.info("early stop after epoch %d: no better validation %s for %d epochs (best: epoch %d)",
                     self.pos.epoch, self.objective.select, patience, best)
        return True

    def batches(self, global_batches: list[list[int]]) -> Iterator[tuple[list[int], tuple[Batch, int]]]:
        """``(global ids, (this process's batch on the device, its offset))`` per batch, read ahead."""
        with Prefetcher(self._load, global_batches, depth=self.config.prefetch) as loaded:
            yield from loaded

    def _load(self, image_ids: list[int]) -> tuple[Batch, int]:
        local, offset = self.dist.shard(image_ids)  # each process reads only its block of images
        batch = self.data.batch(local, regions=self.model.reads_regions)
        if self.dist.device.type == "cuda":
            return batch.pin().to(self.dist.device, non_blocking=True), offset
        return batch, offset

    def step(self, image_ids: list[int], loaded: tuple[Batch, int]) -> dict[str, float]:
        """One optimiser step on a global batch (``loaded``: this process's block, from :meth:`batches`),
        or one per turn of an objective with :attr:`~caprl.objectives.Objective.turns` (metrics
        ``<turn>/<name>``, ``loss`` their turns' sum)."""
        self.loss_fn.train()
        batch, offset = loaded
        batch.noise = decoding.Noise(self.config.seed, self.pos.step, total=len(image_ids), offset=offset)
        if self.graphed is not None and (out := self.graphed.run(batch)) is not None:
            loss_t, tensors = out  # read after the replay (one wait for the device per step, as below)
            return {"loss": float(loss_t), **{k: float(v) for k, v in tensors.items()}}
        if not self.objective.turns:
            loss, metrics = self._update(batch, None)
            return self.dist.mean_metrics({"loss": loss, **metrics})
        total, merged = 0.0, {}
        for turn in self.objective.turns:
            loss, metrics = self._update(batch, turn)
            total += loss
            merged.update({f"{turn}/loss": loss, **{f"{turn}/{k}": v for k, v in metrics.items()}})
        return self.dist.mean_metrics({"loss": total, **merged})

    def _update(self, batch: Batch, turn: str | None) -> tuple[float, dict[str, float]]:
        """Loss (of ``turn``), backward, clip and one optimiser step; parameters without a gradient stay."""
        timeshared.reset(self.loss_fn)
        with torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.config.amp == "bf16"):
            loss, metrics = self.loss_fn(batch) if turn is None else self.loss_fn(batch, turn)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        timeshared.check(self.loss_fn)
        if self.config.grad_clip > 0:
            for params in self.clipped:
                torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        self.optimizer.step()
        return float(loss.detach()), metrics

    def _validation(self) -> tuple[dict[str, float], float]:
        """Validation metrics and the selection score. Every process computes them (same weights,
        same numbers): the caption metrics of a captioner's method, plus whatever the objective
        measures of its own modules."""
        val = {**(self.validate(self.model) if self.objective.captioner else {}),
               **self.objective.validation(self.model, self.data)}
        select = self.objective.select
        if select not in val:
            raise CaprlError(f"objective {self.objective.name} selects epochs on '{select}', "
                             f"but validation gives {', '.join(sorted(val))}")
        return val, val[select]

    def _keep_if_best(self, score: float, epoch: int) -> None:
        """``best.pt`` <- every module now, if ``score`` beats the best so far (strictly: a tie keeps the earlier)."""
        if score > self.pos.best_score:
            self.pos.best_score, self.pos.best_epoch = score, epoch
            if self.dist.main:
                checkpoint.save(self.state_dir / "best.pt", self._checkpoint(with_state=False))

    def _score_start(self) -> None:
        """Epoch 0: the starting weights validated, recorded and kept as the best so far; saved
        at once, so a resumed run never validates them again."""
        started = time.time()
        val, score = self._validation()
        record = {"epoch": 0, "step": 0, "train_loss": None, "step_losses": [], "start": True,
                  "seconds": round(time.time() - started, 2), **{f"val_{k}": v for k, v in val.items()}}
        self.pos.history.append(record)
        self.tracker.log_metrics({f"val/{k}": v for k, v in val.items()}, step=0)
        log.info("start (epoch 0, the init weights): val %s %.4f", self.objective.select, score)
        self._keep_if_best(score, 0)
        self.save_state()

    def _end_epoch(self, losses: list[float], seconds: float) -> None:
        val, score = self._validation()
        train_loss = float(np.mean(losses)) if losses else float("nan")
        lr = self.lrs(self.pos.epoch, max(self.pos.step - 1, 0))[self._model_group()]  # the epoch's last step's
        record = {"epoch": self.pos.epoch + 1, "step": self.pos.step, "train_loss": train_loss, "lr": lr,
                  "step_losses": losses, "seconds": round(seconds, 2), **{f"val_{k}": v for k, v in val.items()}}
        self.pos.history.append(record)
        self.tracker.log_metrics({**{f"val/{k}": v for k, v in val.items()}, "train/epoch_loss": train_loss,
                                  "train/lr": lr}, step=self.pos.step)
        log.info("epoch %d: train loss %.4f, lr %.3g, val %s %.4f (%.1fs)", self.pos.epoch + 1, train_loss, lr,
                 self.objective.select, score, seconds)
        self._keep_if_best(score, self.pos.epoch + 1)
        self.pos.epoch += 1
        self.pos.batch = 0
        self.pos.epoch_losses = []
        self.save_state()


def caption_words(model: CaptionModel, data: CaptionData, image_ids: list[int], max_length: int,
                  batch_size: int = 100, beam_size: int = 1) -> dict[int, list[str]]:
    """The caption (last stage) of every image, as word lists: greedy, or with ``beam_size`` > 1
    the best beam of a beam search of that width (evaluation's decoders, :data:`caprl.decoding.DECODERS`)."""
    decoder = decoding.DECODERS.get("beam" if beam_size > 1 else "greedy", where="validation")
    out: dict[int, list[str]] = {}
    for ids, tokens in decoding.decode_split(model, data.features_of, image_ids,
                                             lambda m, ctx: decoder(m, ctx, max_length, beam_size=beam_size),
                                             batch_size, desc="validation"):
        out.update(zip(ids, data.decode(tokens[:, 0])))
    return out
