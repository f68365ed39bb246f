"""Score a set of captions with the official metrics and record them (files + MLflow)."""

from __future__ import annotations

import logging
from typing import Any

from caprl import io
from caprl.errors import CaprlError
from caprl.evaluation import clip_score
from caprl.metrics.official import shared_scorer
from caprl.tracking import Tracker, params_tags, provenance

log = logging.getLogger(__name__)


def score_and_record(
    params: dict[str, Any],
    label: str,
    info: dict[str, Any],
    captions: dict[int, str],
    references: dict[int, list[str]],
    out_captions: str,
    out_scores: str,
    out_examples: str,
    extra: dict[str, Any] | None = None,
    train_run_id: str = "",
) -> dict[str, Any]:
    """Write COCO-format results, official scores (``out_scores``), and log both to MLflow.

    ``info`` (dataset, run, model, method, ...) is stored beside the metrics so the tables
    can be built from the score files alone; ``info["dataset"]`` names the dataset.
    ``extra`` sections (e.g. ``diversity``) are stored in the score file as they are.
    ``train_run_id``: the MLflow run of the training job; the evaluation run is nested under
    it and its test metrics are also logged there (``test/<metric>``), so comparing training
    runs shows params and test metrics side by side.
    """
    if "dataset" not in info:
        raise CaprlError(f"{label}: the evaluation info has no 'dataset' (pass --dataset to the stage)")
    dataset = str(info["dataset"])
    ev = params["evaluate"]
    results = [{"image_id": int(i), "caption": captions[i]} for i in sorted(captions)]
    io.write_json(out_captions, results)
    scorer = shared_scorer(params["spice"]["corenlp_dir"])  # one METEOR JVM per job
    scored = scorer.score(references, dict(captions), metrics=list(ev["metrics"]), per_image=False)
    missing = {**scored.get("unavailable", {}), **clip_score.unavailable((extra or {}).get(clip_score.SECTION))}
    report = {**info, "provenance": provenance(), "split": ev["split"], "n_images": len(results),
              "metrics": scored["corpus"], **(extra or {}),
              # why a metric was not computed, without this machine's paths
              "unavailable": {m: io.portable(why) for m, why in missing.items()}}
    io.write_json(out_scores, report)
    for name, reason in report["unavailable"].items():
        log.warning("%s unavailable: %s", name, reason)
    log.info("%s: %s", label, ", ".join(f"{k} {v:.4f}" for k, v in report["metrics"].items()))
    examples = [{"image_id": i, "caption": captions[i], "references": references[i]}
                for i in sorted(captions)[: ev["n_examples"]]]
    io.write_json(out_examples, examples)
    tags = {**params_tags(params), "stage": "evaluate", **{k: str(v) for k, v in info.items() if not isinstance(v, (dict, list))}}
    with Tracker(params["tracking"]["experiment"], f"{dataset}/{label}/evaluate", tags=tags, stage="evaluate",
                 parent_run_id=train_run_id or None) as tracker:
        tracker.log_params({"evaluate": ev, "decode": params["decode"], **{"info": info}})
        tracker.log_metrics(report["metrics"])
        if train_run_id:
            tracker.log_metrics({f"test/{k}": v for k, v in report["metrics"].items()}, run_id=train_run_id)
            if (extra or {}).get("lookahead"):
                tracker.log_metrics({f"test_lookahead/{k}": v for k, v in extra["lookahead"]["metrics"].items()},
                                    run_id=train_run_id)
            tracker.set_tags({"caprl.evaluate.run_id": tracker.run_id or ""}, run_id=train_run_id)
        for section, scores in (extra or {}).get("diversity", {}).items():
            if section in ("rs", "bs"):
                tracker.log_metrics({f"{section}/{k}": v for k, v in scores.items()})
        vocabulary = (extra or {}).get("vocabulary")  # caprl.evaluation.vocabulary
        if vocabulary:
            tracker.log_metrics({f"vocabulary/{k}": float(v) for k, v in vocabulary.items()})
        clip = (extra or {}).get(clip_score.SECTION) or {}  # CLIP-S by its embedding: clip/CLIP-S, listener/CLIP-S
        if clip.get("metrics"):
            tracker.log_metrics({f"{clip['embedding']}/{k}": v for k, v in clip["metrics"].items()})
        lookahead = (extra or {}).get("lookahead")  # paper 003: the same weights decoded by lookahead
        if lookahead:
            tracker.log_metrics({f"lookahead/{k}": v for k, v in lookahead["metrics"].items()})
        for path in (out_captions, out_scores, out_examples):
            tracker.log_artifact(path)
    return report
