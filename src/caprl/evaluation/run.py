"""``caprl evaluate``: beam-search captions of a split, scored with the official metrics."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch
from tqdm import tqdm

from caprl import decoding, params as params_mod
from caprl.errors import CaprlError
from caprl.evaluation.report import score_and_record
from caprl.metrics.score_cli import load_references
from caprl.models import CaptionModel
from caprl.training import checkpoint
from caprl.training.data import CaptionData, add_data_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", required=True)
    add_data_arguments(parser)
    parser.add_argument("--refs", required=True, help="COCO caption-annotation file of the split (caprl references)")
    parser.add_argument("--out-examples", required=True, help="output: a few captions beside their references")
    parser.add_argument("--out-captions", required=True, help="output: COCO results format")
    parser.add_argument("--out-scores", required=True, help="output: official metrics (JSON)")


def beam_captions(model: CaptionModel, data: CaptionData, image_ids: list[int], beam_size: int,
                  max_length: int, batch_size: int) -> dict[int, str]:
    model.eval()
    captions: dict[int, str] = {}
    with torch.no_grad():
        for i in tqdm(range(0, len(image_ids), batch_size), desc="beam search", leave=False, mininterval=2.0, disable=None):
            ids = image_ids[i : i + batch_size]
            tokens, _ = decoding.beam_search(model, model.encode(*data.features_of(ids)), beam_size, max_length)
            captions.update(zip(ids, (" ".join(w) for w in data.decode(tokens[:, 0]))))
    return captions


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    torch.set_num_threads(max(1, params["train"]["num_threads"]))
    data = CaptionData.from_args(args)
    payload = checkpoint.load(args.checkpoint, vocab_sha256=data.vocab.sha256)
    model = checkpoint.model_from_checkpoint(payload)
    split = params["evaluate"]["split"]
    references = load_references(args.refs)
    ids = data.split_ids(split)
    missing = sorted(set(ids) - set(references))
    if missing:
        raise CaprlError(f"{args.refs} has no references for {len(missing)} {split} images (e.g. {missing[:3]}): "
                         "rebuild it with `caprl references` from the same annotations")
    captions = beam_captions(model, data, ids, params["decode"]["beam_size"], params["decode"]["max_length"],
                             params["evaluate"]["batch_size"])
    info: dict[str, Any] = {"run": args.run, **payload["run"], "beam_size": params["decode"]["beam_size"]}
    score_and_record(params, args.run, info, captions, references, args.out_captions, args.out_scores,
                     args.out_examples)
