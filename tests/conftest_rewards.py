"""Shared, cached test data for the rewards/metrics tests (imported by those test modules).

Not a conftest.py: the values are cached per process with ``functools.cache`` so that the
slow steps (PTB tokenisation, METEOR's JVM) run once per test session whichever test
module asks first.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
COCO_TEST = (REPO / "../shared/data/coco/karpathy_test5k_captions.json").resolve()


def coco_path() -> Path:
    if not COCO_TEST.exists():
        pytest.skip(f"shared COCO captions not found at {COCO_TEST}")
    return COCO_TEST


@functools.cache
def _coco_tokenised() -> tuple[dict[int, list[str]], dict[int, list[list[str]]]]:
    from caprl.metrics.official import ptb_tokenize

    data = json.loads(coco_path().read_text(encoding="utf-8"))
    raw: dict[int, list[str]] = defaultdict(list)
    for ann in data["annotations"]:
        raw[ann["image_id"]].append(ann["caption"])
    tokens = ptb_tokenize(raw)
    return dict(raw), {i: [s.split() for s in caps] for i, caps in tokens.items()}


def coco_raw() -> dict[int, list[str]]:
    """Karpathy test split: image id -> raw reference sentences."""
    return _coco_tokenised()[0]


def coco_tokens() -> dict[int, list[list[str]]]:
    """Karpathy test split, PTB-tokenised by pycocoevalcap (once per session)."""
    coco_path()
    return _coco_tokenised()[1]


@functools.cache
def official_scorer():  # noqa: ANN201 - returns caprl.metrics.official.OfficialScorer
    """One OfficialScorer (one METEOR JVM) for the session; closed at interpreter exit."""
    from caprl.metrics.official import OfficialScorer

    return OfficialScorer()


def held_out(n_images: int) -> tuple[list[int], list[list[str]], dict[int, list[list[str]]]]:
    """First ``n_images``: candidate = first reference, references = the others."""
    tokens = coco_tokens()
    ids = list(tokens)[:n_images]
    return ids, [tokens[i][0] for i in ids], {i: tokens[i][1:] for i in ids}


def perturb(captions: list[list[str]], vocab: list[str], seed: int = 0) -> list[list[str]]:
    """Resample ~30% of tokens, truncate some captions (0-2 words), add unseen and repeated words."""
    rng = np.random.default_rng(seed)
    out = []
    for k, cap in enumerate(captions):
        cap = [vocab[rng.integers(len(vocab))] if rng.random() < 0.3 else w for w in cap]
        kind = k % 10
        if kind == 0:
            cap = cap[: k % 3]
        elif kind == 1:
            cap = cap + ["zzunseenword", "zzunseenword", f"zz{k}"]
        elif kind == 2:
            cap = cap[:3] * 3
        out.append(cap)
    return out
