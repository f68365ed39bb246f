"""``caprl mlflow-sync``: log to MLflow, from the jobs' own files, what the jobs could not.

A job whose tracking server was down (or slow, or locked) went on without MLflow; its
outputs hold everything: ``history.json`` and the checkpoint (training), ``scores.json``
(evaluation), ``retrieval.json`` (recall@K). This command walks the plan of params.yaml and,
for every job whose files exist but whose MLflow run does not (tag ``caprl.job``), creates
the run as the job would have (params, per-epoch metrics, test metrics in the training
run, nesting, source tags) and tags it ``caprl.logged_from=files``. It also adds the test
metrics to a training run that lacks them. Running it twice logs nothing new::

    MLFLOW_TRACKING_URI=http://server:5000 caprl mlflow-sync
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from caprl import params as params_mod
from caprl.models import checkpoint
from caprl.tracking import Tracker, params_tags, tracking_uri
from caprl.training.run import tracked_config, train_tags
from caprl.workflow.plan import BASELINE_RUN, RETRIEVAL, SCORES, TrainJob, build_plan

log = logging.getLogger(__name__)
FROM_FILES = {"caprl.logged_from": "files"}
RECALL = ("R@1", "R@5", "R@10", "mean_rank", "median_rank")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list what would be logged, log nothing")


def logged_jobs(experiment: str) -> dict[str, Any]:
    """``caprl.job`` tag -> MLflow run, for every run of the experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id], max_results=50_000)
    return {r.data.tags.get("caprl.job", r.info.run_name): r for r in runs}


def epoch_metrics(entry: dict[str, Any]) -> dict[str, float]:
    """A history record's metrics under the trainer's MLflow keys (``train/epoch_loss``,
    ``train/lr``, ``val/<metric>``); no ``train_loss`` at epoch 0 (the start: null), and flags
    (``start``) and positions (``epoch``, ``step``) are not metrics."""
    renamed = {"train_loss": "train/epoch_loss", "lr": "train/lr"}
    return {renamed.get(k, k.replace("val_", "val/", 1)): v for k, v in entry.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("epoch", "step")}


def sync_train(params: dict[str, Any], job: TrainJob, known: dict[str, Any]) -> str | None:
    """Create the training run from history.json and the checkpoint; its run id (None: nothing to log)."""
    name = f"{job.dataset}/{job.run}/train"
    if name in known:
        return known[name].info.run_id
    if not Path(job.history).exists():
        return None
    history = json.loads(Path(job.history).read_text(encoding="utf-8"))
    init_run_ids = {role: known[f"{job.dataset}/{source}/train"].info.run_id for role, source in job.spec.init.items()
                    if f"{job.dataset}/{source}/train" in known}
    tags = {**params_tags(params), **train_tags(job.dataset, job.run, job.spec, init_run_ids), **FROM_FILES}
    config = tracked_config(params, job.dataset, job.spec, job.run)
    with Tracker(params["tracking"]["experiment"], name, tags=tags, stage="train") as tracker:
        tracker.log_params(config)
        tracker.log_text(yaml.safe_dump(config, sort_keys=False), "config.yaml")
        for entry in history["epochs"]:
            tracker.log_metrics(epoch_metrics(entry), step=int(entry.get("step", entry["epoch"])))
        if isinstance(history.get("best_epoch"), int):
            last = history["epochs"][-1] if history["epochs"] else {}
            tracker.log_metrics({"best/epoch": history["best_epoch"]}, step=int(last.get("step", 0)))
        tracker.log_artifact(job.history)
        return tracker.run_id if tracker.active else None


def sync_result(params: dict[str, Any], dataset: str, run: str, kind: str, path: Path, parent: str | None,
                known: dict[str, Any]) -> bool:
    """Log an evaluation (``scores.json``) or retrieval (``retrieval.json``) run, and its
    test metrics into the training run ``parent``; False if nothing was logged."""
    name = f"{dataset}/{run}/{kind}"
    report = json.loads(path.read_text(encoding="utf-8"))
    metrics = report["metrics"] if kind == "evaluate" else {k: report[k] for k in RECALL}
    logged = False
    if name not in known:
        tags = {**params_tags(params), "stage": kind, "dataset": dataset, "run": run, **FROM_FILES,
                **({"captions": report["captions"]} if kind == "retrieval" and "captions" in report else {})}
        with Tracker(params["tracking"]["experiment"], name, tags=tags, stage=kind, parent_run_id=parent) as tracker:
            if kind == "evaluate":
                tracker.log_params({"evaluate": params["evaluate"], "decode": params["decode"]})
            tracker.log_metrics(metrics)
            tracker.log_artifact(path)
            logged = tracker.active
    parent_run = next((r for r in known.values() if r.info.run_id == parent), None)
    has_test = parent_run is not None and any(f"test/{k.replace('@', '_at_')}" in parent_run.data.metrics
                                              for k in metrics)
    if parent and not has_test:
        with Tracker(params["tracking"]["experiment"], f"{dataset}/{run}/train", run_id=parent,
                     stage="train", keep_status=True) as tracker:
            tracker.log_metrics({f"test/{k}": v for k, v in metrics.items()})
            logged = logged or tracker.active
    return logged


def link_inits(params: dict[str, Any], jobs: list[TrainJob]) -> None:
    """Tag each training run with its init runs' ids (``caprl.init.<role>.run_id``) where the
    job could not (its init run was not in MLflow when it started)."""
    known = logged_jobs(params["tracking"]["experiment"])
    for job in jobs:
        run = known.get(f"{job.dataset}/{job.run}/train")
        if run is None:
            continue
        links = {f"caprl.init.{role}.run_id": known[f"{job.dataset}/{source}/train"].info.run_id
                 for role, source in job.spec.init.items()
                 if f"caprl.init.{role}.run_id" not in run.data.tags and f"{job.dataset}/{source}/train" in known}
        if links:
            with Tracker(params["tracking"]["experiment"], f"{job.dataset}/{job.run}/train", run_id=run.info.run_id,
                         stage="train", keep_status=True) as tracker:
                tracker.set_tags(links)
            log.info("%s/%s: linked its init runs", job.dataset, job.run)


def sync(params: dict[str, Any], dry_run: bool = False) -> list[str]:
    """Log every job whose files exist and whose MLflow run is missing; the names of what was logged."""
    known = logged_jobs(params["tracking"]["experiment"])
    plan = build_plan(params)
    done: list[str] = []
    for dataset in plan.datasets:
        for job in plan.trained(dataset):
            files = [p for p in (job.history, job.result(SCORES), job.result(RETRIEVAL)) if Path(p).exists()]
            if dry_run:
                done += [f"{dataset}/{job.run}/{kind}" for kind, p in zip(("train", "evaluate", "retrieval"), files)
                         if f"{dataset}/{job.run}/{kind}" not in known]
                continue
            parent = sync_train(params, job, known)
            if parent and f"{dataset}/{job.run}/train" not in known:
                done.append(f"{dataset}/{job.run}/train")
            if not parent and Path(job.checkpoint).exists():
                parent = checkpoint.mlflow_run_id(job.checkpoint) or None
            for kind, pattern in (("evaluate", SCORES), ("retrieval", RETRIEVAL)):
                path = Path(job.result(pattern))
                if path.exists() and sync_result(params, dataset, job.run, kind, path, parent, known):
                    done.append(f"{dataset}/{job.run}/{kind}")
        if not dry_run:
            link_inits(params, plan.trained(dataset))
        baseline = Path(SCORES.format(dataset=dataset, run=BASELINE_RUN))
        name = f"{dataset}/{BASELINE_RUN}/evaluate"
        if baseline.exists() and name not in known:
            if dry_run or sync_result(params, dataset, BASELINE_RUN, "evaluate", baseline, None, known):
                done.append(name)
    return done


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    done = sync(params, dry_run=args.dry_run)
    verb = "would log" if args.dry_run else "logged"
    log.info("%s %d job(s) to %s%s", verb, len(done), tracking_uri(), "".join(f"\n  {n}" for n in done))
