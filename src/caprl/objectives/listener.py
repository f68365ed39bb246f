"""The listener of paper 004 (PSST) as an objective's module: its pre-training, and the helpers
the discriminative methods (:mod:`caprl.objectives.discriminative`) share.

``listener`` pre-trains the listener alone on the gold captions (paper 004, sec. 6.1 and
appendix A.1: the listener is pre-trained before any joint training) with eq. 4, VSE++'s
max-of-hinges with the hardest negatives of the batch, after ``warmup_epochs`` of VSE0's
sum of hinges over every negative (our choice, the paper is silent: from random weights the
hardest negatives collapse on the synthetic set, val R@10 0.12 after 12 epochs, against 0.67
with 5 warm-up epochs; VSE++ starts from pre-trained ImageNet features and more data). The caption model has no optimiser
group, so it is left untouched; a later run starts its ``listener`` role from this run's
checkpoint (``init: {listener: <this run>}``).

Recall (sec. 6.2): each val image's caption (the first gold caption for the listener's own
pre-training, the caption model's greedy caption for the captioners' methods) ranks every
val image by cosine similarity; R@K is the fraction of captions whose image is in the top K.
The paper ranks among 5000 test images (COCO); we rank among all images of the split.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from caprl import decoding
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, ObjectiveEnv, Options, register_objective
from dataclasses import dataclass

from caprl.retrieval import Listener, ListenerConfig, ranks_of, recall_report, vse_hinge, vse_sum_hinge

RECALL_KEYS = ("R@1", "R@5", "R@10")
VAL_BATCH = 100  # images per validation batch


def build_listener(env: ObjectiveEnv, model: CaptionModel) -> Listener:
    """The listener of the params' ``listener:`` section (``env.extras["listener"]``), over the
    caption model's vocabulary and the pooled features (``env.extras["feat_dim"]``, else the
    caption model's feature size)."""
    config = env.extras.get("listener")
    if config is None:
        raise CaprlError("the params section `listener:` is missing (word_size, hidden_size, margin): the "
                         "discriminative methods (paper 004) build their listener from it")
    if not isinstance(config, ListenerConfig):
        config = ListenerConfig.from_dict(dict(config))
    return Listener(config, model.vocab_size, int(env.extras.get("feat_dim", model.feat_dim)))


def image_targets(images: int, per_image: int, device: torch.device) -> torch.Tensor:
    """``[images * per_image]``: the image (column) of each caption row, image-major as
    :func:`caprl.decoding.sample` returns ``n`` samples per image."""
    return torch.arange(images, device=device).repeat_interleave(per_image)


def disc_losses(listener: Listener, captions: torch.Tensor, pooled: torch.Tensor, per_image: int,
                lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 4 per caption ``[N]``: ``captions`` (token ids ``[N, T]`` or rows over the vocabulary
    ``[N, T, V]`` with their ``lengths``), ``per_image`` consecutive rows per image of
    ``pooled [B, D]``, against the batch's images and the batch's other images' captions."""
    sim = listener.similarity(captions, pooled, lengths)  # [N, B]
    target = image_targets(pooled.shape[0], per_image, sim.device)
    return vse_hinge(sim, target, listener.config.margin)


def first_captions(batch: Batch) -> torch.Tensor:
    """``[B, T]``: the first gold caption of every image of the batch (``label_image`` is
    sorted: each image's captions are consecutive rows of ``labels``)."""
    counts = torch.bincount(batch.label_image, minlength=len(batch.image_ids))
    if bool((counts == 0).any()):
        raise CaprlError(f"image {batch.image_ids[int((counts == 0).nonzero()[0])]} has no gold caption")
    starts = torch.cumsum(counts, dim=0) - counts
    return batch.labels.index_select(0, starts)


def recall(captions: torch.Tensor, images: torch.Tensor) -> dict[str, float]:
    """R@1, R@5, R@10 (fractions) of caption embeddings ``[N, H]`` retrieving their image among
    the image embeddings ``[N, H]`` (row i describes image i)."""
    report = recall_report(ranks_of(captions.float() @ images.float().t()))
    return {k: report[k] for k in RECALL_KEYS}


def in_eval_mode(module: torch.nn.Module, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``compute()`` with ``module`` in eval mode and without gradient; its mode restored after."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return compute()
    finally:
        module.train(was_training)


def gold_recall(listener: Listener, data: Any, split: str = "val") -> dict[str, float]:
    """Recall of the first gold caption of every image of ``split`` against all its images."""
    ids = data.split_ids(split)
    device = next(listener.parameters()).device

    def compute() -> dict[str, float]:
        texts, images = [], []
        for start in range(0, len(ids), VAL_BATCH):
            batch = data.batch(ids[start : start + VAL_BATCH], regions=False)
            texts.append(listener.embed_captions(first_captions(batch).to(device)))
            images.append(listener.embed_images(batch.pooled.to(device)))
        return recall(torch.cat(texts), torch.cat(images))

    return in_eval_mode(listener, compute)


def greedy_recall(listener: Listener, model: CaptionModel, data: Any, max_length: int,
                  split: str = "val") -> dict[str, float]:
    """Recall of the caption model's greedy caption (last stage) of every image of ``split``
    against all its images. Each batch's features are read once: the pooled features the
    decoder reads are kept for the listener's image side."""
    ids = data.split_ids(split)
    pooled_of: dict[int, torch.Tensor] = {}

    def features_of(chunk: list[int], regions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        pooled, regions_ = data.features_of(chunk, regions)
        pooled_of[chunk[0]] = pooled  # read by a background thread; one entry per chunk
        return pooled, regions_

    def decode(m: CaptionModel, ctx: Any) -> torch.Tensor:
        tokens = decoding.greedy_decoder(m, ctx, max_length)[:, 0]  # [B, T]
        return listener.embed_captions(tokens)

    def compute() -> dict[str, float]:
        texts, images = [], []
        device = next(listener.parameters()).device
        for chunk, embedded in decoding.decode_split(model, features_of, ids, decode, VAL_BATCH, desc="recall"):
            texts.append(embedded)
            images.append(listener.embed_images(pooled_of.pop(chunk[0]).to(device)))
        return recall(torch.cat(texts), torch.cat(images))

    return in_eval_mode(listener, compute)


class ListenerObjective(Objective):
    """An objective that holds a listener (``self.listener``, checkpointed as role ``listener``)
    and is evaluated by retrieval."""

    holds = ("listener",)
    retrieval = True
    select = "R@10"

    def __init__(self, options: Options, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.listener = build_listener(env, model)

    def caption_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean over the captions of the global batch (DDP-correct, as :meth:`Objective.mean`)."""
        return self.mean(values, torch.ones_like(values))


@dataclass
class ListenerOptions(Options):
    warmup_epochs: int  # first epochs on VSE0's sum of hinges, then eq. 4 (hardest negatives)


@register_objective("listener")
class ListenerPretraining(ListenerObjective):
    """Pre-training of the listener alone: eq. 4 over every gold caption of the batch against
    the batch's images (``sim [M, B]``), averaged over the captions. The caption model is
    not trained (no optimiser group); validation: recall of the val images' first gold caption."""

    captioner = False
    gold_retrieval = True  # its listener's recall of the test images' first gold captions (caprl retrieval --gold)
    Options = ListenerOptions
    options: ListenerOptions

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return [{"params": list(self.listener.parameters()), "lr": self.options.lr, "name": "listener"}]

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        sim = self.listener.similarity(batch.labels, batch.pooled)  # [M, B]
        steps_per_epoch = int(self.env.extras.get("steps_per_epoch", 1))
        step = batch.noise.step if batch.noise is not None else 0
        warm = step < self.options.warmup_epochs * steps_per_epoch
        per_caption = (vse_sum_hinge if warm else vse_hinge)(sim, batch.label_image, self.listener.config.margin)
        loss = self.caption_mean(per_caption)
        return loss, {"l_disc": float(loss.detach())}

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        return gold_recall(self.listener, data)
