"""The image-text embeddings of CLIP-S (:mod:`caprl.metrics.clip_score`), by name, and what a stage
needs to build them.

An embedding is named by an :class:`EmbeddingSpec` (params.yaml: ``evaluate.clip_score`` for the
metric, a ``rewards:`` entry of kind ``clip_s`` for the reward)::

    embedding: clip | listener
    model: openai/clip-vit-base-patch32   # clip: the CLIP checkpoint (Hessel et al.: ViT-B/32)
    listener: listener                    # listener: the run whose pre-trained listener embeds
    prompt: A photo depicts               # clip: the caption prefix (Hessel et al.)

* ``clip`` (:class:`caprl.metrics.clip_model.ClipEmbedding`): CLIP on the raw images under the
  dataset's ``media_root``: the metric of the papers. Stage argument ``--media-root``.
* ``listener`` (:class:`ListenerEmbedding`): the listener of paper 004 (VSE++ on the features,
  :class:`caprl.retrieval.Listener`) of a ``listener`` run: the built-in synthetic sets' stand-in,
  where no CLIP weights fit the images. Its CLIP-S is another number than CLIP's and is labelled
  "(listener)" wherever it is shown. Stage argument ``--embedding-listener`` (the run's best.pt).

:data:`EMBEDDINGS` holds both (a new one is one entry); :class:`EmbeddingSource` builds them, once
per spec, for a stage from its data and its :class:`EmbeddingInputs`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from caprl.errors import CaprlError
from caprl.metrics.clip_score import CLIP_S, Embedding
from caprl.registry import Registry

NONE = "none"  # evaluate.clip_score.embedding: no CLIP-S
SPEC_KEYS = ("embedding", "model", "listener", "prompt")


class MissingInput(CaprlError):
    """The stage was not given the file an embedding reads (the workflow gives none where the
    embedding's run does not train on the dataset): the metric is then unavailable, with this reason."""


@dataclass(frozen=True)
class EmbeddingSpec:
    embedding: str  # a name of EMBEDDINGS
    model: str  # clip: the CLIP checkpoint (Hugging Face hub name or folder)
    listener: str  # listener: the run whose listener embeds (its best.pt is --embedding-listener)
    prompt: str  # clip: the caption prefix

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str) -> "EmbeddingSpec":
        missing = [k for k in SPEC_KEYS if k not in values]
        if missing:
            raise CaprlError(f"{where}: missing {', '.join(missing)} (the embedding of CLIP-S: {', '.join(SPEC_KEYS)})")
        EMBEDDINGS.get(str(values["embedding"]), where=f"{where}.embedding")
        for key in SPEC_KEYS[1:]:
            if not isinstance(values[key], str):
                raise CaprlError(f"{where}.{key}: must be a string, got {values[key]!r}")
        return cls(*(str(values[k]) for k in SPEC_KEYS))

    def label(self, metric: str = CLIP_S) -> str:
        """How the tables name its ``metric`` (CLIP-S, RefCLIP-S): "CLIP-S" with CLIP, "CLIP-S (listener)"."""
        return f"{metric}{EMBEDDINGS.get(self.embedding).suffix}"

    def describe(self) -> dict[str, str]:
        """The fields its embedding reads (the score file records them beside its scores)."""
        return {"embedding": self.embedding, **{k: getattr(self, k) for k in EMBEDDINGS.get(self.embedding).reads}}


@dataclass(frozen=True)
class EmbeddingInputs:
    """The files a stage's embeddings read, from its command line."""

    listener: str | None = None  # --embedding-listener: best.pt of the spec's listener run
    media_root: str | None = None  # --media-root: the dataset's raw images (clip)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EmbeddingInputs":
        return cls(getattr(args, "embedding_listener", None), getattr(args, "media_root", None))


def add_embedding_arguments(parser: argparse.ArgumentParser) -> None:
    """The optional inputs of CLIP-S's embeddings (what the workflow plan passes where needed)."""
    parser.add_argument("--embedding-listener", default=None, metavar="CHECKPOINT",
                        help="CLIP-S with embedding listener: best.pt of the listener run the spec names")
    parser.add_argument("--media-root", default=None, metavar="DIR",
                        help="CLIP-S with embedding clip: the folder of the dataset's images (datasets.<name>.media_root)")


class ListenerEmbedding:
    """Paper 004's listener as CLIP-S's embedding: an image is its pooled feature through the
    listener's image side, a caption its words (the vocabulary's ids, UNK outside it) through
    the GRU; both L2-normalised by the listener (:class:`caprl.retrieval.Listener`)."""

    name = "listener"

    def __init__(self, listener: Any, encode: Callable[[Sequence[str]], list[int]],
                 pooled_of: Callable[[list[int]], torch.Tensor]) -> None:
        self.listener = listener.eval()
        self.encode, self.pooled_of = encode, pooled_of
        self.device = next(listener.parameters()).device

    @torch.no_grad()
    def embed_images(self, image_ids: Sequence[int]) -> torch.Tensor:
        return self.listener.embed_images(self.pooled_of([int(i) for i in image_ids]).to(self.device).float())

    @torch.no_grad()
    def embed_texts(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        from caprl.retrieval.load import token_matrix

        return self.listener.embed_captions(token_matrix([self.encode(c) for c in captions]).to(self.device))


@dataclass(frozen=True)
class Sources:
    """What a stage has to build an embedding from."""

    params: Mapping[str, Any]
    data: Any  # caprl.data.loader.CaptionData
    inputs: EmbeddingInputs
    device: torch.device


def _clip(spec: EmbeddingSpec, sources: Sources) -> Embedding:
    from caprl.metrics.clip_model import ClipEmbedding, image_paths, load_clip

    if not sources.inputs.media_root:
        raise MissingInput("CLIP-S with embedding clip reads the raw images: pass --media-root (the dataset's "
                         "media_root; the workflow passes it)")
    model, tokenizer, processor = load_clip(spec.model, sources.device)
    return ClipEmbedding(model, tokenizer, processor, image_paths(sources.data.annotations, sources.inputs.media_root),
                         spec.prompt)


def _listener(spec: EmbeddingSpec, sources: Sources) -> Embedding:
    from caprl.retrieval.load import load_listener
    from caprl.io import provenance
    from caprl.models import checkpoint

    path, data = sources.inputs.listener, sources.data
    if not path:
        raise MissingInput(f"CLIP-S with embedding listener reads the listener of run '{spec.listener}', and no "
                           f"--embedding-listener was given (the workflow gives runs/<dataset>/{spec.listener}/best.pt "
                           f"where run {spec.listener} trains on the dataset)")
    ckpt = checkpoint.load(path)
    trained_by = ckpt.run.get("name")
    if trained_by and trained_by != spec.listener:
        raise CaprlError(f"--embedding-listener {path} is run {trained_by}'s checkpoint, but the embedding names run "
                         f"'{spec.listener}' (its listener:)")
    listener = load_listener(path, dict(sources.params), len(data.vocab), data.feat_dim, data.vocab.sha256)
    provenance.check_model_inputs(path, ckpt.made_from, data.paths.features, data.features.attrs,
                                  data.paths.annotations, data.annotations)
    return ListenerEmbedding(listener.to(sources.device), data.vocab.encode,
                             lambda ids: data.features_of(ids, regions=False)[0])


@dataclass(frozen=True)
class EmbeddingKind:
    build: Callable[[EmbeddingSpec, Sources], Embedding]
    reads: tuple[str, ...]  # the spec's fields it uses (besides embedding), recorded beside its scores
    flag: str  # the stage argument of its input file
    suffix: str  # after "CLIP-S" in the tables: "" for CLIP itself
    run: Callable[[EmbeddingSpec], str | None]  # the run whose checkpoint is its input (None: none)
    input: Callable[[EmbeddingSpec, str, Callable[[str], str]], str]  # (spec, media_root, checkpoint of run) -> path


EMBEDDINGS: Registry[EmbeddingKind] = Registry("embedding")
EMBEDDINGS.add("clip", EmbeddingKind(_clip, ("model", "prompt"), "--media-root", "", lambda spec: None,
                                     lambda spec, media_root, checkpoint_of: media_root))
EMBEDDINGS.add("listener", EmbeddingKind(_listener, ("listener",), "--embedding-listener", " (listener)",
                                         lambda spec: spec.listener,
                                         lambda spec, media_root, checkpoint_of: checkpoint_of(spec.listener)))


class EmbeddingSource:
    """The embeddings of one stage, each built once (a spec -> its embedding)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._built: dict[EmbeddingSpec, Embedding] = {}

    def __call__(self, spec: EmbeddingSpec) -> Embedding:
        if spec not in self._built:
            self._built[spec] = EMBEDDINGS.get(spec.embedding).build(spec, self.sources)
        return self._built[spec]


def stage_files(spec: EmbeddingSpec | None, media_root: str, checkpoint_of: Callable[[str], str],
                trained: Callable[[str], bool]) -> dict[str, str]:
    """``{flag: path}``: what a stage computing CLIP-S with ``spec`` is given (the workflow plan's
    view); {} for no spec, or where the spec's run is not ``trained`` on the dataset."""
    if spec is None:
        return {}
    kind = EMBEDDINGS.get(spec.embedding)
    run = kind.run(spec)
    if run is not None and not trained(run):
        return {}
    return {kind.flag: kind.input(spec, media_root, checkpoint_of)}


@dataclass(frozen=True)
class ClipScoreSettings:
    """``evaluate.clip_score`` with ``datasets.<name>.clip_score`` on top (``embedding`` not none)."""

    spec: EmbeddingSpec
    w: float  # CLIP-S = w * max(cos, 0) (Hessel et al.: 2.5)


def clip_score_settings(params: Mapping[str, Any], dataset: str) -> ClipScoreSettings | None:
    """The CLIP-S evaluation of ``dataset``; None where its embedding is ``none`` or
    ``evaluate.clip_score`` is not set."""
    section = params["evaluate"].get("clip_score")
    if section is None:
        return None
    own = (params["datasets"].get(dataset) or {}).get("clip_score") or {}
    merged = {**section, **own}
    where = f"datasets.{dataset}.clip_score" if own else "evaluate.clip_score"
    if merged.get("embedding") == NONE:
        return None
    w = merged.get("w")
    if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0:
        raise CaprlError(f"{where}.w: must be a positive number (Hessel et al.: 2.5), got {w!r}")
    return ClipScoreSettings(EmbeddingSpec.from_dict(merged, where), float(w))
