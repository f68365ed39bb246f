"""``caprl evaluate``: beam-search captions of a split, scored with the official metrics."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch

from caprl import checkpoint, decoding, params as params_mod
from caprl.decoding import DECODERS
from caprl.errors import CaprlError
from caprl.evaluation.report import score_and_record
from caprl.metrics.score_cli import load_references
from caprl.models import CaptionModel
from caprl.device import default_device
from caprl.data.loader import CaptionData, Loading, add_data_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", required=True)
    add_data_arguments(parser)
    parser.add_argument("--refs", required=True, help="COCO caption-annotation file of the split (caprl references)")
    parser.add_argument("--out-examples", required=True, help="output: a few captions beside their references")
    parser.add_argument("--out-captions", required=True, help="output: COCO results format")
    parser.add_argument("--out-scores", required=True, help="output: official metrics (JSON)")


def decoded_captions(model: CaptionModel, data: CaptionData, image_ids: list[int], method: str,
                     batch_size: int, **settings: Any) -> dict[int, str]:
    """The caption of every image by decoder ``method`` (``decode.method``), on the model's device."""
    captions: dict[int, str] = {}
    decode = DECODERS.get(method, where="decode.method")
    for ids, tokens in decoding.decode_split(model, data.features_of, image_ids,
                                             lambda m, ctx: decode(m, ctx, **settings), batch_size, desc=method):
        captions.update(zip(ids, (" ".join(w) for w in data.decode(tokens[:, 0]))))
    return captions



def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    torch.set_num_threads(max(1, params["train"]["num_threads"]))
    data = CaptionData.from_args(args, Loading.from_params(params))
    ckpt = checkpoint.load(args.checkpoint, vocab_sha256=data.vocab.sha256)
    model = checkpoint.model_from_checkpoint(ckpt).to(default_device())
    split = params["evaluate"]["split"]
    references = load_references(args.refs)
    ids = data.split_ids(split)
    missing = sorted(set(ids) - set(references))
    if missing:
        raise CaprlError(f"{args.refs} has no references for {len(missing)} {split} images (e.g. {missing[:3]}): "
                         "rebuild it with `caprl references` from the same annotations")
    decode = params["decode"]
    captions = decoded_captions(model, data, ids, decode["method"], params["evaluate"]["batch_size"],
                                beam_size=decode["beam_size"], max_length=decode["max_length"])
    info: dict[str, Any] = {**ckpt.run, "run": args.run, "dataset": args.dataset, "decode": decode["method"],
                            "beam_size": decode["beam_size"], "code_version": ckpt.code_version}
    score_and_record(params, args.run, info, captions, references, args.out_captions, args.out_scores,
                     args.out_examples)
