"""A run's listener from its checkpoint, and caption token rows as the listener reads them: shared
by retrieval's evaluation (:mod:`caprl.evaluation.retrieval`) and the listener's image-text
embedding of CLIP-S on the built-in sets (:mod:`caprl.metrics.embeddings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from caprl.errors import CaprlError
from caprl.models import checkpoint
from caprl.retrieval.listener import Listener, ListenerConfig

LISTENER = "listener"  # the checkpoint role of a run's listener


def token_matrix(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[N, T]`` token ids, each row ended by 0 (the end token) and padded with 0."""
    width = max([len(r) for r in rows] + [0]) + 1
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out


def load_listener(path: str | Path, params: dict[str, Any], vocab_size: int, feat_dim: int,
                  vocab_sha256: str) -> Listener:
    """The run's listener from its checkpoint (sizes: params.yaml ``listener:``)."""
    ckpt = checkpoint.load(path, vocab_sha256=vocab_sha256)
    if LISTENER not in ckpt.modules:
        method = ckpt.run.get("method", "?")
        raise CaprlError(f"{path} holds no listener (modules: {', '.join(sorted(ckpt.modules))}): "
                         f"the run's method '{method}' has no listener to rank images with")
    if "listener" not in params:
        raise CaprlError("params.yaml: no listener: section (word_size, hidden_size, margin)")
    listener = Listener(ListenerConfig.from_dict(params["listener"]), vocab_size, feat_dim)
    try:
        listener.load_state_dict(ckpt.module(LISTENER, where=str(path)).state)
    except RuntimeError as exc:
        raise CaprlError(f"{path}: its listener does not fit params.yaml listener: and the data "
                         f"(vocabulary {vocab_size}, features {feat_dim}): {exc}") from exc
    return listener
