"""CLIP-S and RefCLIP-S (Hessel et al. 2021, "CLIPScore: A Reference-free Evaluation Metric for
Image Captioning", EMNLP, sec. 3), over any image-text embedding.

With unit vectors ``c`` (the candidate caption), ``v`` (the image) and ``r`` (each reference)::

    CLIP-S(c, v)       = w * max(cos(c, v), 0)                                  w = 2.5
    RefCLIP-S(c, R, v) = H-Mean(CLIP-S(c, v), max(max_{r in R} cos(c, r), 0))

H-Mean is the harmonic mean ``2ab / (a + b)`` (0 where both are 0). A corpus's value is the mean
over its captions (jmhessel/clipscore ``clipscore.py``: ``np.mean(per)``). The reference code
takes ``max_r cos(c, r)`` without the paper's ``max(., 0)``; we follow the paper (they differ only
where every reference is anti-correlated with the caption).

The embedding is an :class:`Embedding`: CLIP (:class:`caprl.metrics.clip_model.ClipEmbedding`,
Hessel et al.'s ViT-B/32 and prompt) or the listener of paper 004
(:class:`caprl.metrics.embeddings.ListenerEmbedding`, the built-in sets' stand-in: a different
model, so its numbers are labelled "(listener)" wherever they are shown). :class:`ClipScorer`
computes both scores in batches on the embedding's device, each image's vector once
(:class:`ImageVectors`): RL rewards revisit the same images every epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from caprl.errors import CaprlError

CLIP_S, REF_CLIP_S = "CLIP-S", "RefCLIP-S"  # the score file's metric names


class Embedding(Protocol):
    """Images (by id) and captions (lists of words) in one space, as unit rows on ``device``."""

    name: str
    device: torch.device

    def embed_images(self, image_ids: Sequence[int]) -> torch.Tensor:
        """``[N, H]`` unit vectors of the images."""

    def embed_texts(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        """``[N, H]`` unit vectors of the captions (lists of words)."""


def clip_s(texts: torch.Tensor, images: torch.Tensor, w: float) -> torch.Tensor:
    """``[N]`` CLIP-S = ``w * max(cos(c, v), 0)`` of row n of ``texts`` and of ``images`` ``[N, H]``."""
    cos = (F.normalize(texts.float(), dim=-1) * F.normalize(images.float(), dim=-1)).sum(dim=-1)
    return w * cos.clamp(min=0.0)


def reference_similarity(texts: torch.Tensor, references: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """``[N]``: ``max(max_r cos(c_n, r), 0)`` over the references ``[M, H]`` whose ``owner [M]`` is n.
    A caption without references gets 0."""
    texts, references = F.normalize(texts.float(), dim=-1), F.normalize(references.float(), dim=-1)
    cos = (texts.index_select(0, owner) * references).sum(dim=-1)
    best = torch.zeros(texts.shape[0], device=texts.device)  # 0: the max(., 0) floor
    return best.scatter_reduce(0, owner, cos, reduce="amax", include_self=True)


def harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``2ab / (a + b)`` element-wise for ``a, b >= 0``; 0 where both are 0."""
    total = a + b
    return torch.where(total > 0, 2.0 * a * b / total.clamp(min=torch.finfo(total.dtype).tiny), torch.zeros_like(total))


class ImageVectors:
    """The embedding's vector of each image, computed once (in batches of ``batch_size``) and kept
    on its device: an RL run asks for the same images every epoch."""

    def __init__(self, embedding: Embedding, batch_size: int) -> None:
        self.embedding, self.batch_size = embedding, int(batch_size)
        self._rows: dict[int, torch.Tensor] = {}
        self.computed = 0  # images embedded so far (the rest came from the cache)

    def __call__(self, image_ids: Sequence[int]) -> torch.Tensor:
        new = [int(i) for i in dict.fromkeys(int(i) for i in image_ids) if int(i) not in self._rows]
        for start in range(0, len(new), self.batch_size):
            chunk = new[start : start + self.batch_size]
            vectors = self.embedding.embed_images(chunk)
            if vectors.shape[0] != len(chunk):
                raise CaprlError(f"embedding {self.embedding.name}: {vectors.shape[0]} vectors for {len(chunk)} images")
            self._rows.update(zip(chunk, vectors))
            self.computed += len(chunk)
        if not image_ids:
            return torch.zeros(0, 0, device=self.embedding.device)
        return torch.stack([self._rows[int(i)] for i in image_ids])


class ClipScorer:
    """CLIP-S and RefCLIP-S of captions with ``embedding`` (weight ``w``), batched on its device."""

    def __init__(self, embedding: Embedding, w: float, batch_size: int) -> None:
        if batch_size < 1:
            raise CaprlError(f"CLIP-S: batch size must be positive, got {batch_size}")
        self.embedding, self.w, self.batch_size = embedding, float(w), int(batch_size)
        self.images = ImageVectors(embedding, batch_size)

    def texts(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        """``[N, H]``: the captions' vectors, ``batch_size`` at a time."""
        chunks = [self.embedding.embed_texts(captions[k : k + self.batch_size])
                  for k in range(0, len(captions), self.batch_size)]
        return torch.cat(chunks) if chunks else torch.zeros(0, 0, device=self.embedding.device)

    @torch.no_grad()
    def clip_s(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> torch.Tensor:
        """``[N]`` CLIP-S of ``captions[n]`` for image ``image_ids[n]``."""
        if len(image_ids) != len(captions):
            raise CaprlError(f"CLIP-S: {len(image_ids)} image ids but {len(captions)} captions")
        if not captions:
            return torch.zeros(0, device=self.embedding.device)
        return clip_s(self.texts(captions), self.images(image_ids), self.w)

    @torch.no_grad()
    def scores(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]],
               references: Mapping[int, Sequence[Sequence[str]]]) -> dict[str, torch.Tensor]:
        """``{CLIP-S: [N], RefCLIP-S: [N]}`` of each caption, against its image and its image's
        ``references`` (lists of words)."""
        if len(image_ids) != len(captions):
            raise CaprlError(f"CLIP-S: {len(image_ids)} image ids but {len(captions)} captions")
        missing = [int(i) for i in image_ids if int(i) not in references]
        if missing:
            raise CaprlError(f"RefCLIP-S: image {missing[0]} has no references ({len(missing)} images without)")
        texts = self.texts(captions)
        clip = clip_s(texts, self.images(image_ids), self.w)
        refs = [r for i in image_ids for r in references[int(i)]]
        owner = torch.as_tensor([n for n, i in enumerate(image_ids) for _ in references[int(i)]], dtype=torch.long,
                                device=texts.device)
        ref = reference_similarity(texts, self.texts(refs), owner) if refs else torch.zeros_like(clip)
        return {CLIP_S: clip, REF_CLIP_S: harmonic_mean(clip, ref)}


def corpus_scores(scorer: ClipScorer, captions: Mapping[int, Sequence[str]],
                  references: Mapping[int, Sequence[Sequence[str]]]) -> dict[str, float]:
    """``{CLIP-S, RefCLIP-S}``: the means over the images of ``captions`` (image id -> its caption's
    words) of each caption's scores (Hessel et al.: the corpus value is the mean)."""
    ids = sorted(captions)
    if not ids:
        raise CaprlError("CLIP-S: no captions to score")
    per = scorer.scores(ids, [list(captions[i]) for i in ids], references)
    return {name: float(values.double().mean()) for name, values in per.items()}
