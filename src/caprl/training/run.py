"""``caprl train --run NAME ...``: train one run (a model and an objective) from params.yaml.

Outputs: ``--checkpoint`` (the best weights on validation CIDEr-D, with their config) and
``--history`` (per-epoch metrics). ``--state-dir`` holds the resume state (``last.pt``,
``best.pt``); it is not a DAG output, so a re-submitted job finds it and resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from caprl import io, params as params_mod
from caprl.errors import CaprlError
from caprl.models import build_model
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.rewards import build_reward, compute_document_frequencies, load_document_frequencies
from caprl.seeding import seed_everything
from caprl.tracking import Tracker
from caprl.training import checkpoint, distributed
from caprl.training.data import CaptionData, add_data_arguments
from caprl.training.distributed import Dist
from caprl.training.loop import LoopConfig, Trainer, greedy_captions

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="run name under runs.xe / runs.rl in params.yaml")
    add_data_arguments(parser)
    parser.add_argument("--cider-df", required=True, help="document frequencies of the training references")
    parser.add_argument("--init", default=None, help="checkpoint to start from (RL runs: the XE run's best)")
    parser.add_argument("--checkpoint", required=True, help="output: best checkpoint")
    parser.add_argument("--history", required=True, help="output: per-epoch metrics (JSON)")
    parser.add_argument("--state-dir", required=True, help="resume state (last.pt); kept across restarts")


def config_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(paths: list[str | None]) -> list[tuple[str, int, int]]:
    """Size and mtime of every input file: a rebuilt input makes a left-over state stale."""
    return [(str(p), Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in paths if p is not None]


def make_validator(data: CaptionData, max_length: int) -> Any:
    """Validation CIDEr-D of greedy captions, document frequencies from the val references (as coco-eval)."""
    refs = data.references("val")
    scorer = build_reward("cider_d", refs, compute_document_frequencies(refs))
    ids = sorted(refs)

    def validate(model: torch.nn.Module) -> dict[str, float]:
        caps = greedy_captions(model, data, ids, max_length)
        return {"CIDEr-D": float(scorer(ids, [caps[i] for i in ids]).mean())}

    return validate


def train(params: dict[str, Any], run: str, data: CaptionData, cider_df_path: str, init: str | None,
          state_dir: Path, dist: Dist | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Train ``run``; returns the path of the best state and the per-epoch history."""
    dist = dist or Dist()
    spec = params_mod.run_spec(params, run)
    if spec["model"] not in params["models"]:
        raise CaprlError(f"runs.{run}.model: '{spec['model']}' is not defined under models: in params.yaml")
    if spec["objective"] not in params["objectives"]:
        raise CaprlError(f"runs.{run}.objective: '{spec['objective']}' is not defined under objectives: in params.yaml")
    if spec["init"] is not None and init is None:
        raise CaprlError(f"run '{run}' starts from run '{spec['init']}': pass its checkpoint with --init")
    seed_everything(params["seed"] + 1000 * dist.rank)  # dropout streams differ per process
    torch.set_num_threads(max(1, params["train"]["num_threads"]))
    model_params = dict(params["models"][spec["model"]])
    arch = model_params.pop("arch")
    model = build_model(arch, model_params, len(data.vocab), data.feat_dim, data.n_regions, where=f"models.{spec['model']}")
    if init is not None:
        model.load_state_dict(checkpoint.load(init, vocab_sha256=data.vocab.sha256)["model_state"])
    objective_options = spec["options"]
    train_refs = data.references("train")
    rewards: dict[str, Any] = {}
    df = None

    def reward(name: str) -> Any:
        nonlocal df
        if name not in rewards:
            df = df if df is not None else load_document_frequencies(cider_df_path)
            rewards[name] = build_reward(name, train_refs, df)
        return rewards[name]

    env = ObjectiveEnv(decode_words=data.decode, reward=reward, max_length=params["decode"]["max_length"],
                       global_sum=dist.sum, world_size=dist.world)
    objective = build_objective(spec["objective"], objective_options, env)
    t = params["train"]
    loop = LoopConfig(epochs=objective_options["epochs"], lr=objective_options["lr"], batch_size=t["batch_size"],
                      grad_clip=t["grad_clip"], checkpoint_every=t["checkpoint_every"], log_every=t["log_every"],
                      max_length=params["decode"]["max_length"], seed=params["seed"])
    meta = {"arch": arch, "model_options": model_params, "vocab_sha256": data.vocab.sha256,
            "vocab_size": len(data.vocab), "feat_dim": data.feat_dim, "n_regions": data.n_regions,
            "run": {k: v for k, v in spec.items() if v is not None},
            "config_hash": config_hash(spec, arch, model_params, objective_options, t, params["seed"],
                                       params["decode"],
                                       fingerprint([*vars(data.paths).values(), cider_df_path, init]))}
    experiment = params["tracking"]["experiment"]
    previous = state_dir / "last.pt"
    run_id = None
    if previous.exists():
        run_id = checkpoint.load(previous).get("mlflow_run_id") or None
    with Tracker(experiment, f"{params['dataset']['name']}/{run}/train",
                 tags={"stage": "train", "dataset": params["dataset"]["name"], "run": run,
                       "model": spec["model"], "objective": spec["objective"]}, run_id=run_id,
                 enabled=dist.main) as tracker:
        trainer = Trainer(model, objective, data, loop, make_validator(data, loop.max_length), state_dir, meta,
                          tracker, dist)
        if not trainer.resume():
            tracker.log_params({"run": spec, "model": params["models"][spec["model"]],
                                "objective": objective_options, "train": t, "seed": params["seed"],
                                "dataset": params["dataset"], "features": {"backbone": params["features"]["backbone"]}})
        position = trainer.fit(data.split_ids("train"))
        tracker.log_metrics({"best/val_CIDEr-D": position.best_score}, step=position.step)
    return state_dir / "best.pt", position.history


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    world = params["train"]["gpus"]
    if world > 1 and not distributed.launched():
        distributed.spawn(world, run_process, args)  # torchrun / srun launch the processes themselves
    else:
        run_process(args)


def run_process(args: argparse.Namespace) -> None:
    """One training process (of one, or of a DDP group); process 0 writes the outputs."""
    params = params_mod.load(args.params)
    dist = distributed.from_environment()
    if dist.world != params["train"]["gpus"]:
        log.warning("train.gpus is %d but %d processes were launched", params["train"]["gpus"], dist.world)
    data = CaptionData.from_args(args)
    state_dir = Path(args.state_dir)
    best, history = train(params, args.run, data, args.cider_df, args.init, state_dir, dist)
    if not dist.main:
        return
    with io.atomic_path(args.checkpoint) as tmp:
        shutil.copyfile(best, tmp)
    io.write_json(args.history, {"run": args.run, "epochs": history})
    log.info("run %s: best val CIDEr-D %.4f -> %s", args.run, max(h["val_CIDEr-D"] for h in history), args.checkpoint)
