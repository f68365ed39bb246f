"""CLIP-S as a reward (Cho et al. 2022, "Fine-grained Image Captioning with CLIP Reward", NAACL
Findings, sec. 3): ``R(c, v) = w * max(cos(c, v), 0)`` of the caption and its image in an
image-text embedding (Hessel et al. 2021's CLIP-S, :mod:`caprl.metrics.clip_score`).

Cho et al. (j-min/CLIP-Caption-Reward, ``captioning/utils/clipscore.py`` and
``configs/phase2/clipRN50_clips.yml`` / ``clipRN50_cider_clips.yml``): CLIP ViT-B/32 from
transformers, w = 2.5, the prompt "A photo depicts", self-critical baseline (the greedy
caption's reward), the CLIP-S reward weighted ``clipscore_reward_weight: 2.0``; "CLIP-S + CIDEr"
adds CIDEr-D at ``cider_reward_weight`` 1 (their opts.py default). In params.yaml these are
``rewards:`` entries: ``{kind: clip_s, ...}`` alone, and ``{kind: mix, weights: {clip_s: 2.0,
cider_d: 1.0}, ...}`` (a mix hands its embedding options to its clip_s component).

The embedding is given, not built here (rewards know nothing of models): the trainer passes a
function spec -> embedding (:class:`caprl.metrics.embeddings.EmbeddingSource`). Each image's
vector is computed once and kept (:class:`caprl.metrics.clip_score.ImageVectors`); the captions
of one call are embedded in batches on the embedding's device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from caprl.errors import CaprlError
from caprl.metrics.clip_score import ClipScorer, Embedding
from caprl.metrics.embeddings import EmbeddingSpec
from caprl.rewards.base import Reward

BATCH = 256  # captions (and new images) per forward pass of the embedding

EmbeddingFactory = Callable[[EmbeddingSpec], Embedding]


class ClipS(Reward):
    """``w * max(cos(caption, image), 0)`` of each (image id, caption) in ``embedding``."""

    name = "clip_s"

    def __init__(self, embedding: Embedding, w: float) -> None:
        self.scorer = ClipScorer(embedding, w, BATCH)

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        self.check_batch(image_ids, captions)
        return self.scorer.clip_s(list(image_ids), list(captions)).double().cpu().numpy()


def build_clip_s(embeddings: EmbeddingFactory | None, embedding: str, model: str, listener: str, prompt: str,
                 w: float) -> ClipS:
    """A :class:`ClipS` over the embedding the options name (``embeddings`` builds it)."""
    spec = EmbeddingSpec.from_dict({"embedding": embedding, "model": model, "listener": listener, "prompt": prompt},
                                   "reward clip_s")
    if embeddings is None:
        raise CaprlError("reward clip_s needs an image-text embedding, and this stage gives none (the trainer passes "
                         "its data's embeddings: caprl train)")
    return ClipS(embeddings(spec), w)
