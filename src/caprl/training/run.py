"""``caprl train --run NAME ...``: train one run (a model and an objective) from params.yaml.

Outputs: ``--checkpoint`` (every module at the best epoch on the objective's validation
metric, CIDEr-D for captioners, with their config) and
``--history`` (:func:`history_json`: per-epoch metrics and the selected epoch). ``--state-dir``
holds the resume state (``last.pt``, ``best.pt``); it is not a DAG output, so a re-submitted
job finds it and resumes.
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
import yaml

from caprl import io, params as params_mod
from caprl.models import checkpoint
from caprl.io import provenance
from caprl.objectives import run_checks
from caprl.errors import CaprlError
from caprl.metrics.embeddings import EmbeddingInputs, EmbeddingSource, Sources, add_embedding_arguments
from caprl.models import build_model, compat
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.rewards import (RewardReferences, build_configured_reward, build_reward, compute_document_frequencies,
                           load_document_frequencies)
from caprl.seeding import seed_everything
from caprl.tracking import Tracker
from caprl.training import distributed
from caprl.data.loader import CaptionData, Loading, add_data_arguments
from caprl.training.distributed import Dist
from caprl.training.loop import Position, RunMeta, Trainer, caption_words
from caprl.training.settings import TrainSettings

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--run", required=True, help="run name under runs: in params.yaml")
    add_data_arguments(parser)
    parser.add_argument("--cider-df", required=True, help="document frequencies of the training references")
    parser.add_argument("--init", action="append", default=[], metavar="ROLE=PATH",
                        help="start module ROLE (model, or an objective's module) from checkpoint PATH; repeatable")
    parser.add_argument("--checkpoint", required=True, help="output: best checkpoint")
    parser.add_argument("--history", required=True, help="output: per-epoch metrics (JSON)")
    parser.add_argument("--state-dir", required=True, help="resume state (last.pt); kept across restarts")
    add_embedding_arguments(parser)  # a clip_s reward's embedding: the workflow passes its input


def parse_inits(values: list[str]) -> dict[str, str]:
    """``["model=runs/ds/fc-xe/best.pt", ...]`` -> ``{"model": "runs/ds/fc-xe/best.pt"}``."""
    out: dict[str, str] = {}
    for value in values:
        role, sep, path = value.partition("=")
        if not sep or not role or not path:
            raise CaprlError(f"--init {value!r}: expected ROLE=PATH, e.g. --init model=runs/synthetic/fc-xe/best.pt")
        out[role] = path
    return out


def check_init_files(spec: params_mod.RunSpec, dataset: str, inits: dict[str, str]) -> None:
    """Every ``--init`` before any work: a role the run's method has, an existing checkpoint (else
    a CaprlError naming it and the params key ``runs.<run>.init.<role>`` whose run makes it), and
    for the caption model one from a run that trains it (:mod:`caprl.objectives.run_checks`, as the plan)."""
    for role, path in inits.items():
        run_checks.refuse(run_checks.init_role_problem(spec.source, spec.method, role))
        if Path(path).is_file():
            continue
        source = spec.init.get(role)
        if source is None:
            raise CaprlError(f"--init {role}={path}: checkpoint not found, and params runs.{spec.source} has no "
                             f"init.{role} (its init: {spec.init or 'none'}); drop this --init or add the role")
        raise CaprlError(f"--init {role}={path}: checkpoint not found; params runs.{spec.source}.init.{role} starts "
                         f"this run from run {source}: train {source} on dataset {dataset} first "
                         f"(`snakemake runs/{dataset}/{source}/best.pt`), or pass its best checkpoint")
    if checkpoint.MODEL in inits:
        record = checkpoint.load(inits[checkpoint.MODEL]).run
        if record.get("method"):
            problem = run_checks.init_model_problem(spec.source, str(record.get("name")), record["method"],
                                                    dict(record.get("init") or {}))
            run_checks.refuse(problem and f"--init model={inits[checkpoint.MODEL]}: {problem}")


def config_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(paths: list[str | None]) -> list[tuple[str, int, int]]:
    """Size and mtime of every input file: a rebuilt input makes a left-over state stale."""
    return [(str(p), Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in paths if p is not None]


def make_validator(data: CaptionData, beam_size: int, max_length: int) -> Any:
    """Validation CIDEr-D of the captions of a beam search of ``beam_size`` (1: greedy), document
    frequencies from the val references (as coco-eval)."""
    refs = data.references("val")
    if not refs:
        raise CaprlError(f"{data.paths.annotations}: the val split has no images; the best epoch is chosen on "
                         "validation, so give the dataset a val split (Karpathy 'val')")
    scorer = build_reward("cider_d", refs, compute_document_frequencies(refs))
    ids = sorted(refs)

    def validate(model: torch.nn.Module) -> dict[str, float]:
        caps = caption_words(model, data, ids, max_length, beam_size=beam_size)
        return {"CIDEr-D": float(scorer(ids, [caps[i] for i in ids]).mean())}

    return validate


def load_inits(modules: dict[str, torch.nn.Module], inits: dict[str, str], expected: dict[str, str],
               run: str, vocab_sha256: str) -> None:
    """Load each role's module from its checkpoint; roles must be the run's ``init`` roles."""
    if set(inits) != set(expected):
        raise CaprlError(f"runs.{run}.init names roles {sorted(expected)} but --init gave {sorted(inits)}")
    for role, path in inits.items():
        if role not in modules:
            raise CaprlError(f"runs.{run}.init.{role}: this run has no module '{role}' "
                             f"(it trains {', '.join(sorted(modules))})")
        ckpt = checkpoint.load(path, vocab_sha256=vocab_sha256)
        checkpoint.load_weights(modules[role], ckpt.module(role, where=path), path, run, role,
                                str(ckpt.run.get("name") or expected[role]))  # the run that wrote it


def run_record(spec: params_mod.RunSpec, dataset: str, run: str) -> dict[str, Any]:
    """What a checkpoint and its MLflow run record of the run (name, method, model, options, init)."""
    return {"name": run, "dataset": dataset, "method": spec.method, "model": spec.model,
            "options": dict(spec.options), "init": dict(spec.init)}


def tracked_config(params: dict[str, Any], dataset: str, spec: params_mod.RunSpec, run: str) -> dict[str, Any]:
    """The params of a training job's MLflow run (flattened there) and its ``config.yaml``."""
    return settings_config(TrainSettings.from_params(params, dataset, run, spec))


def settings_config(settings: TrainSettings) -> dict[str, Any]:
    """:func:`tracked_config` of a job's resolved settings: the sections as params.yaml has them."""
    return {"run": run_record(settings.spec, settings.dataset, settings.run), "model": settings.model.entry(),
            "train": settings.sections["train"], "seed": settings.seed, "dataset": settings.sections["dataset"]}


def train_tags(dataset: str, run: str, spec: params_mod.RunSpec, init_run_ids: dict[str, str]) -> dict[str, str]:
    """A training job's MLflow tags; ``caprl.init.<role>`` names the job each init module comes from
    (and ``.run_id`` its MLflow run, where ``init_run_ids`` knows it)."""
    tags = {"stage": "train", "dataset": dataset, "run": run, "model": spec.model, "method": spec.method}
    for role, source in spec.init.items():
        tags[f"caprl.init.{role}"] = f"{dataset}/{source}/train"
        if init_run_ids.get(role):
            tags[f"caprl.init.{role}.run_id"] = init_run_ids[role]
    return tags


def history_json(run: str, position: Position) -> dict[str, Any]:
    """The ``--history`` file: ``{"run", "best_epoch", "epochs": [record, ...]}``. A record:
    ``epoch`` (1..N; 0: the starting weights of a run with an init, ``"start": true``,
    ``train_loss`` null), ``step``, ``train_loss`` (mean of ``step_losses``; NaN: no step),
    ``lr`` (the caption model's group, else the first group), ``seconds``, ``val_<metric>``.
    ``best_epoch``: the epoch the checkpoint holds (0: the start; null: no epoch scored)."""
    return {"run": run, "best_epoch": position.best_epoch, "epochs": position.history}


def train(params: dict[str, Any], dataset: str, run: str, data: CaptionData, cider_df_path: str,
          inits: dict[str, str], state_dir: Path, dist: Dist | None = None,
          log_file: str | None = None, settings: TrainSettings | None = None,
          embedding_inputs: EmbeddingInputs | None = None) -> tuple[Path, Position]:
    """Train ``run`` on ``dataset``; returns the path of the best state and the final position
    (per-epoch ``history``, ``best_epoch``). ``settings``: what the job resolved of ``params``
    (:class:`~caprl.training.settings.TrainSettings`; resolved here when not given): every value is
    read through it; ``params`` itself goes only to what builds a reward (its ``rewards:``
    instance, CLIP-S's embedding source).

    ``log_file`` (the job's log) is attached to the MLflow run with the config and history;
    ``embedding_inputs``: the files a clip_s reward's embedding reads (``--embedding-listener``, ``--media-root``)."""
    dist = dist or Dist()
    settings = settings or TrainSettings.from_params(params, dataset, run)
    spec = settings.spec
    seed_everything(settings.seed + 1000 * dist.rank)  # dropout streams differ per process
    torch.set_num_threads(settings.num_threads)
    arch, model_params = settings.model.arch, dict(settings.model.sizes)
    model = build_model(arch, model_params, len(data.vocab), data.feat_dim, data.n_regions, where=f"models.{spec.model}")
    lengths = compat.caption_lengths(params, dataset, settings.max_length, data.vocab.max_length)  # env.max_length's
    run_checks.refuse(compat.length_problem(spec.source, spec.model, model.config, lengths))  # as the plan
    train_refs = RewardReferences.from_labels(data.references("train"), data.labels, data.vocab)  # captions, labels
    rewards: dict[str, Any] = {}
    df = None
    embedding_inputs = embedding_inputs or EmbeddingInputs()
    embeddings = EmbeddingSource(Sources(params, data, embedding_inputs, dist.device))  # built when a reward asks

    def reward(name: str) -> Any:
        nonlocal df
        if name not in rewards:
            if df is None:
                df = load_document_frequencies(cider_df_path)
                provenance.check(cider_df_path, df.made_from, data.paths.annotations, data.annotations,
                                 "`caprl cider-df`")
            rewards[name] = build_configured_reward(name, params, train_refs, df, embeddings)
        return rewards[name]

    # what objectives may read besides the model: the listener's sizes (paper 004's methods build
    # theirs from it; they name the section when it is missing), the pooled feature size, the
    # seed, the optimiser steps of an epoch
    steps = -(-len(data.split_ids("train")) // settings.batch_size)
    extras: dict[str, Any] = {"feat_dim": data.feat_dim, "seed": settings.seed, "steps_per_epoch": steps,
                              "words": list(data.vocab.idx_to_word)}  # remove_bad_endings names words
    if settings.listener is not None:
        extras["listener"] = settings.listener
    env = ObjectiveEnv(decode_words=data.decode, reward=reward, max_length=settings.max_length,
                       global_sum=dist.sum, world_size=dist.world, extras=extras)
    objective = build_objective(spec.method, spec.options, env, model, where=f"runs.{run}")
    reward_name = getattr(objective.options, "reward", None)
    if reward_name:  # built now, a clip_s reward's CLIP or listener loaded: one that cannot load fails before any write
        reward(reward_name)
    for path in dict.fromkeys(inits.values()):  # what a run starts from was trained on these data
        provenance.check_model_inputs(path, checkpoint.load(path).made_from, data.paths.features, data.features.attrs,
                                      data.paths.annotations, data.annotations)
    load_inits({checkpoint.MODEL: model, **objective.modules_to_save()}, inits, spec.init, run, data.vocab.sha256)
    objective.begin(model)  # a reference policy copies the start; a resume below overwrites it with the saved one
    loop = settings.loop(objective.options.epochs)
    record = run_record(spec, dataset, run)
    val_decode = settings.validation_decode()
    sections = settings.sections
    meta = RunMeta(arch=arch, run=record, vocab_sha256=data.vocab.sha256,
                   config_hash=config_hash(record, arch, model_params, sections["train"], settings.seed,
                                           sections["decode"], val_decode, sections["reward"],
                                           sections["listener"] if objective.modules_to_save() else None,
                                           fingerprint([*vars(data.paths).values(), cider_df_path, *inits.values(),
                                                               embedding_inputs.listener])),
                   made_from={**provenance.record(data.annotations),
                              "features": provenance.features_record(data.features.attrs)})
    previous = state_dir / "last.pt"  # a resumed job logs on into its MLflow run; changed parameters: a new one
    run_id = (checkpoint.resumable_run_id(previous, meta.config_hash) or None) if previous.exists() else None
    init_run_ids = {role: checkpoint.mlflow_run_id(path) for role, path in inits.items() if Path(path).is_file()}
    tags = {**settings.tracking_tags, **train_tags(dataset, run, spec, init_run_ids)}
    # the trainer's start (its state resumed, or Adam's state carried from the init checkpoints: one without
    # it fails here) before the MLflow run opens, so that a start that fails writes nothing
    trainer = Trainer(model, objective, data, loop, make_validator(data, **val_decode), state_dir, meta, None, dist)
    resumed = trainer.resume()
    if not resumed:
        trainer.start_optimizer(inits)
    with Tracker(settings.experiment, f"{dataset}/{run}/train", tags=tags, run_id=run_id, enabled=dist.main,
                 stage="train") as tracker:
        trainer.tracker = tracker
        config = settings_config(settings)
        if not resumed:
            tracker.log_params(config)
            tracker.log_text(yaml.safe_dump(config, sort_keys=False), "config.yaml")
        position = trainer.fit(data.split_ids("train"))
        best = {f"best/val_{objective.select}": position.best_score}
        if position.best_epoch is not None:
            best["best/epoch"] = position.best_epoch
        tracker.log_metrics(best, step=position.step)
        tracker.log_text(json.dumps(history_json(run, position), indent=1), "history.json")
        if log_file:
            tracker.log_artifact(log_file)
    for reward_fn in rewards.values():
        close = getattr(reward_fn, "close", None)
        if close is not None:
            close()
    return state_dir / "best.pt", position


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
    settings = TrainSettings.from_params(params, args.dataset, args.run)  # the job's settings, resolved once
    dist = distributed.from_environment()
    if dist.world != settings.gpus:
        log.warning("train.gpus is %d but %d processes were launched", settings.gpus, dist.world)
    check_init_files(settings.spec, args.dataset, parse_inits(args.init))
    data = CaptionData.from_args(args, Loading.from_params(params))
    state_dir = Path(args.state_dir)
    best, position = train(params, args.dataset, args.run, data, args.cider_df, parse_inits(args.init), state_dir, dist,
                           log_file=args.log, settings=settings, embedding_inputs=EmbeddingInputs.from_args(args))
    if not dist.main:
        return
    with io.atomic_path(args.checkpoint) as tmp:
        shutil.copyfile(best, tmp)
    io.write_json(args.history, history_json(args.run, position))
    log.info("run %s: best checkpoint (epoch %s) -> %s", args.run, position.best_epoch, args.checkpoint)
