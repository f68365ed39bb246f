"""CLIP-S and RefCLIP-S of a run's evaluated captions (Hessel et al. 2021): the score file's
``clip_score`` section, and the main table's columns.

Settings: ``evaluate.clip_score`` with the dataset's ``datasets.<name>.clip_score`` on top
(:func:`caprl.metrics.embeddings.clip_score_settings`): ``embedding`` (clip: CLIP on the raw
images, the papers' metric; listener: paper 004's listener on the features, the built-in sets'
stand-in; none), ``model``, ``listener``, ``prompt``, ``w``. Each caption is scored against its
image and the image's references (the annotations' tokenised captions, as every caprl metric
reads them; Hessel et al. feed the raw ones), ``evaluate.batch_size`` at a time on the device.

The section written: ``{"label": "CLIP-S (listener)", "embedding": ..., <the spec's fields it
reads>, "w": 2.5, "metrics": {"CLIP-S": mean, "RefCLIP-S": mean}}``, or ``"unavailable": reason``
instead of ``metrics`` where the embedding's input was not given (the listener run does not train
on the dataset) or CLIP cannot be loaded here; the metric names stay "CLIP-S" and "RefCLIP-S", the
label says which embedding made them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from caprl.metrics.clip_model import ClipUnavailable
from caprl.metrics.clip_score import CLIP_S, REF_CLIP_S, ClipScorer, corpus_scores
from caprl.metrics.embeddings import (EmbeddingInputs, EmbeddingSource, MissingInput, Sources, clip_score_settings)

log = logging.getLogger(__name__)

SECTION = "clip_score"  # the score file's section
METRICS = (CLIP_S, REF_CLIP_S)


def clip_score_report(params: Mapping[str, Any], dataset: str, data: Any, inputs: EmbeddingInputs,
                      captions: Mapping[int, str], references: Mapping[int, Sequence[Sequence[str]]],
                      device: torch.device) -> dict[str, Any] | None:
    """The ``clip_score`` section of ``captions`` (image id -> caption) on ``dataset`` (module
    docstring); None where the dataset's embedding is ``none``."""
    settings = clip_score_settings(params, dataset)
    if settings is None:
        return None
    spec = settings.spec
    section: dict[str, Any] = {"label": spec.label(), **spec.describe(), "w": settings.w}
    try:
        embedding = EmbeddingSource(Sources(params, data, inputs, device))(spec)
    except (MissingInput, ClipUnavailable) as exc:
        section["unavailable"] = str(exc)
        log.warning("%s unavailable: %s", spec.label(), exc)
        return section
    scorer = ClipScorer(embedding, settings.w, int(params["evaluate"]["batch_size"]))
    section["metrics"] = corpus_scores(scorer, {i: c.split() for i, c in captions.items()}, references)
    log.info("%s", ", ".join(f"{spec.label(k)} {v:.4f}" for k, v in section["metrics"].items()))
    return section


def table_columns(params: Mapping[str, Any], dataset: str, scores: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The main table's CLIP-S columns on ``dataset``: [] where its embedding is none, or where no
    score file of the table holds them (all written before them, or under another embedding)."""
    settings = clip_score_settings(params, dataset)
    if settings is None or not any(((s or {}).get(SECTION) or {}).get("label") == settings.spec.label()
                                   for s in scores.values()):
        return []
    return [settings.spec.label(m) for m in METRICS]


def table_values(params: Mapping[str, Any], dataset: str, scores: Mapping[str, Any] | None,
                 columns: Sequence[str]) -> list[float | None]:
    """A run's values (%) of the ``columns`` of :func:`table_columns`: None where its score file
    lacks them or holds another embedding's (a score file made under other settings)."""
    settings = clip_score_settings(params, dataset)
    if settings is None or not columns:
        return []
    section = (scores or {}).get(SECTION) or {}
    values = section.get("metrics") or {}
    if section.get("label") != settings.spec.label():
        return [None] * len(METRICS)
    return [100.0 * float(values[m]) if m in values else None for m in METRICS]


def table_note(params: Mapping[str, Any], dataset: str, columns: Sequence[str]) -> list[str]:
    """What the main table's CLIP-S ``columns`` are (one note; none without them)."""
    settings = clip_score_settings(params, dataset)
    if settings is None or not columns:
        return []
    spec = settings.spec
    what = ", ".join(f"{k} {v}" for k, v in spec.describe().items())
    return [f"{spec.label(CLIP_S)} = {settings.w:g} max(cos(caption, image), 0), {spec.label(REF_CLIP_S)} its harmonic "
            f"mean with max(max_ref cos(caption, ref), 0) (Hessel et al. 2021), x100; {what}"
            + ("; not CLIP: the listener of paper 004 on the features" if spec.embedding == "listener" else "") + "."]


def unavailable(section: Mapping[str, Any] | None) -> dict[str, str]:
    """``{label: reason}`` where the section could not be computed ({} otherwise)."""
    if not section or "unavailable" not in section:
        return {}
    return {str(section["label"]): str(section["unavailable"])}
