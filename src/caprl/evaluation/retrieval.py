"""``caprl retrieval``: how well a run's own listener finds each image from a caption of it.

Paper 004, sec. 6.2: every caption of the evaluation split is embedded by the run's listener
(the module ``listener`` of its checkpoint; its sizes are params.yaml ``listener:``) and
compared by cosine with every image of the split (5,000 on COCO, 1,000 on Flickr30K); the
rank of its own image gives recall@1/5/10 and the mean and median rank
(:func:`caprl.retrieval.recall_report`; ties count against the caption). The captions are

* ``--captions captions.json``: the run's generated captions (``caprl evaluate``'s, the
  captions that were scored): runs that train a caption model with a listener;
* ``--gold``: the first gold caption of every image (from the labels file, as the listener's
  validation recall during its pre-training, :func:`caprl.objectives.listener.gold_recall`,
  but on the evaluation split): runs that pre-train a listener alone, an upper reference for
  the generated captions' recall.

Writes ``{"run", "dataset", "split", "listener", "captions", "R@1", "R@5", "R@10",
"mean_rank", "median_rank", "n_images", "ranks": {image_id: rank}}`` atomically;
``captions`` is ``"generated"`` or ``"gold"``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from caprl import io, params as params_mod
from caprl.models import checkpoint
from caprl.io import provenance
from caprl.data.loader import CaptionData, Loading, add_data_arguments
from caprl.data.vocab import Vocab
from caprl.device import default_device
from caprl.errors import CaprlError
from caprl.retrieval import Listener, caption_lengths, ranks_of, recall_report
from caprl.retrieval.load import LISTENER, load_listener, token_matrix  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

OWN_LISTENER = "the run's own"  # the report's "listener": which listener ranked the captions
GENERATED, GOLD = "generated", "gold"  # the report's "captions": which captions ranked the images


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", required=True, help="the run's best.pt (must hold a listener)")
    captions = parser.add_mutually_exclusive_group(required=True)
    captions.add_argument("--captions", default=None,
                          help="the run's captions.json from `caprl evaluate`: [{image_id, caption}]")
    captions.add_argument("--gold", action="store_true",
                          help="rank by each image's first gold caption (the labels file) instead: a listener run")
    add_data_arguments(parser)
    parser.add_argument("--out", required=True, help="output: results/<dataset>/<run>/retrieval.json")


def encode_captions(captions: Sequence[dict[str, Any]], vocab: Vocab, where: str) -> dict[int, list[int]]:
    """``captions.json`` entries -> image id -> token ids; a word outside the vocabulary is an
    error (generated captions only use vocabulary words)."""
    out: dict[int, list[int]] = {}
    for entry in captions:
        if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
            raise CaprlError(f"{where}: expected a list of {{image_id, caption}} (caprl evaluate's captions.json)")
        words = str(entry["caption"]).split()
        unknown = [w for w in words if w not in vocab.word_to_idx]
        if unknown:
            raise CaprlError(f"{where}: image {entry['image_id']}: word '{unknown[0]}' is not in the vocabulary "
                             "(captions of another vocabulary?)")
        image_id = int(entry["image_id"])
        if image_id in out:
            raise CaprlError(f"{where}: image {image_id} has more than one caption")
        out[image_id] = vocab.encode(words)
    return out


@torch.no_grad()
def retrieval_ranks(listener: Listener, captions: Mapping[int, Sequence[int]], image_ids: Sequence[int],
                    pooled: torch.Tensor | np.ndarray, batch_size: int = 500,
                    device: torch.device | None = None) -> dict[int, int]:
    """The rank (1 = first) of each caption's own image among ``image_ids`` (their pooled features
    ``[B, D]``, one row each, in that order) by the listener's cosine; batches on ``device``."""
    device = device or next(listener.parameters()).device
    pooled = torch.as_tensor(pooled)
    if pooled.shape[0] != len(image_ids):
        raise CaprlError(f"{len(image_ids)} images but {pooled.shape[0]} rows of pooled features")
    column = {int(i): k for k, i in enumerate(image_ids)}
    absent = [i for i in captions if i not in column]
    if absent:
        raise CaprlError(f"{len(absent)} captioned images are not among the ranked images (e.g. {absent[:3]})")
    listener = listener.to(device).eval()
    images = torch.cat([listener.embed_images(pooled[k:k + batch_size].to(device).float())
                        for k in range(0, len(image_ids), batch_size)])
    ids = list(captions)
    ranks: dict[int, int] = {}
    for k in range(0, len(ids), batch_size):
        chunk = ids[k:k + batch_size]
        words = token_matrix([captions[i] for i in chunk]).to(device)
        sim = listener.embed_captions(words) @ images.t()
        target = torch.as_tensor([column[i] for i in chunk], device=device)
        ranks.update(zip(chunk, (int(r) for r in ranks_of(sim.cpu(), target.cpu()))))
    return ranks


def pooled_features(data: CaptionData, image_ids: list[int], batch_size: int) -> torch.Tensor:
    """``[B, D]`` pooled features of the images, read in batches (the regions are dropped)."""
    return torch.cat([data.features_of(image_ids[k:k + batch_size], regions=False)[0].float()
                      for k in range(0, len(image_ids), batch_size)])


def gold_captions(data: CaptionData, image_ids: list[int],
                  batch_size: int) -> tuple[dict[int, list[int]], torch.Tensor]:
    """The first gold caption (token ids, up to its end token) of every image, the one the
    listener's validation recall uses (:func:`caprl.objectives.listener.first_captions` of the
    images' batch), and the images' pooled features ``[B, D]``, read in one pass."""
    from caprl.objectives.listener import first_captions

    captions: dict[int, list[int]] = {}
    pooled = []
    for k in range(0, len(image_ids), batch_size):
        batch = data.batch(image_ids[k:k + batch_size], regions=False)
        tokens = first_captions(batch)
        for image_id, row, length in zip(batch.image_ids, tokens, caption_lengths(tokens)):
            captions[int(image_id)] = row[: int(length)].tolist()
        pooled.append(batch.pooled.float())
    return captions, torch.cat(pooled) if pooled else torch.zeros(0, data.feat_dim)


def caption_mode(args: argparse.Namespace) -> str:
    """``gold`` (``--gold``) or ``generated`` (``--captions FILE``); exactly one of them."""
    gold, captions = bool(getattr(args, "gold", False)), getattr(args, "captions", None)
    if gold == (captions is not None):
        raise CaprlError("caprl retrieval: give exactly one of --captions FILE (a run's generated captions) and "
                         "--gold (the first gold caption of every image, for a listener run)")
    return GOLD if gold else GENERATED


def generated_captions(path: str | Path, data: CaptionData, split: str, ids: list[int]) -> dict[int, list[int]]:
    """A ``caprl evaluate`` captions file as token ids; it must caption exactly the split's images."""
    captions = encode_captions(io.read_json(path, "captions file (caprl evaluate)"), data.vocab, str(path))
    missing, extra = sorted(set(ids) - set(captions)), sorted(set(captions) - set(ids))
    if missing or extra:
        raise CaprlError(f"{path}: not the {split} split's captions ({len(missing)} of its {len(ids)} "
                         f"images without a caption, e.g. {missing[:3]}; {len(extra)} other images, e.g. {extra[:3]})")
    return captions


def retrieval_report(params: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Rank the run's captions (generated, or the first gold ones) with its listener against every
    image of the evaluation split."""
    mode = caption_mode(args)
    data = CaptionData.from_args(args, Loading.from_params(params))
    listener = load_listener(args.checkpoint, params, len(data.vocab), data.feat_dim, data.vocab.sha256)
    provenance.check_model_inputs(args.checkpoint, checkpoint.load(args.checkpoint).made_from, args.features,
                                  data.features.attrs, args.annotations, data.annotations)
    split = params["evaluate"]["split"]
    ids = data.split_ids(split)
    batch_size = params["evaluate"]["batch_size"]
    if mode == GOLD:
        captions, pooled = gold_captions(data, ids, batch_size)
    else:
        captions = generated_captions(args.captions, data, split, ids)
        pooled = pooled_features(data, ids, batch_size)
    ranks = retrieval_ranks(listener, captions, ids, pooled, batch_size, default_device())
    report = recall_report([ranks[i] for i in ids])
    return {"run": args.run, "dataset": args.dataset, "split": split, "listener": OWN_LISTENER, "captions": mode,
            **report, "ranks": {str(i): ranks[i] for i in ids}}


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    torch.set_num_threads(max(1, params["train"]["num_threads"]))
    report = retrieval_report(params, args)
    io.write_json(args.out, report)
    from caprl.tracking import Tracker, params_tags

    # nested under the training run (a listener run has no evaluation run: its training run too)
    train_run_id = checkpoint.mlflow_run_id(args.checkpoint) or None
    recall = {k: report[k] for k in ("R@1", "R@5", "R@10", "mean_rank", "median_rank")}
    with Tracker(params["tracking"]["experiment"], f"{args.dataset}/{args.run}/retrieval", stage="retrieval",
                 tags={**params_tags(params), "stage": "retrieval", "dataset": args.dataset, "run": args.run,
                       "captions": report["captions"]},
                 parent_run_id=train_run_id) as tracker:
        tracker.log_metrics(recall)
        tracker.log_artifact(args.out)
        if train_run_id:  # beside the language metrics (a listener run: beside its val recall) in the training run
            tracker.log_metrics({f"test/{k}": v for k, v in recall.items()}, run_id=train_run_id)
    log.info("%s retrieval by its %s captions (%s, %d images): R@1 %.1f%%, R@5 %.1f%%, R@10 %.1f%%, "
             "mean rank %.1f -> %s",
             args.run, report["captions"], report["split"], report["n_images"], 100 * report["R@1"],
             100 * report["R@5"], 100 * report["R@10"], report["mean_rank"], args.out)
