"""Checkpoints: weights, optimiser, position and RNG state, with the config that made them.

A checkpoint holds only tensors and plain Python containers so that it loads with
``torch.load(..., weights_only=True)``; it records the model's architecture and options
and the vocabulary's hash, so it can be loaded without params.yaml and refuses a
different vocabulary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from caprl.errors import CaprlError
from caprl.io import atomic_path
from caprl.models import CaptionModel, build_model


def save(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write atomically: a job killed mid-save leaves the previous checkpoint intact."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load(path: str | os.PathLike[str], vocab_sha256: str | None = None) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"checkpoint not found: {p}")
    try:
        payload = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated/foreign files
        raise CaprlError(f"{p}: not a readable caprl checkpoint ({type(exc).__name__}: {exc})") from exc
    if vocab_sha256 is not None and payload.get("vocab_sha256") != vocab_sha256:
        raise CaprlError(
            f"{p} was trained with a different vocabulary (sha256 {str(payload.get('vocab_sha256'))[:12]}..., "
            f"expected {vocab_sha256[:12]}...): retrain it, or use the vocabulary it was trained with"
        )
    return payload


def model_from_checkpoint(payload: dict[str, Any]) -> CaptionModel:
    """Rebuild the model from the config stored in the checkpoint and load its weights."""
    model = build_model(
        payload["arch"],
        dict(payload["model_options"]),
        vocab_size=int(payload["vocab_size"]),
        feat_dim=int(payload["feat_dim"]),
        n_regions=int(payload["n_regions"]),
        where="checkpoint",
    )
    model.load_state_dict(payload["model_state"])
    return model
