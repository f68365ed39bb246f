"""``caprl baseline``: the most frequent training caption, given to every image of the split.

A floor for the tables: any model that learned something from the image beats it.
"""

from __future__ import annotations

import argparse
from collections import Counter

from caprl import params as params_mod
from caprl.data.annotations import load_annotations
from caprl.evaluation.report import score_and_record
from caprl.evaluation.failure_modes import SECTION as FAILURE_MODES, failure_modes
from caprl.evaluation.vocabulary import caption_stats, training_captions
from caprl.metrics.score_cli import load_references


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--annotations", required=True)
    parser.add_argument("--refs", required=True, help="COCO caption-annotation file of the split (caprl references)")
    parser.add_argument("--out-examples", required=True, help="output: a few captions beside their references")
    parser.add_argument("--out-captions", required=True)
    parser.add_argument("--out-scores", required=True)


def most_frequent_caption(annotations: dict) -> str:
    counts = Counter(" ".join(c) for img in annotations["images"] if img["split"] == "train" for c in img["captions"])
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    params_mod.dataset_spec(params, args.dataset)  # a known dataset
    annotations = load_annotations(args.annotations)
    caption = most_frequent_caption(annotations)
    refs = load_references(args.refs)
    info = {"dataset": args.dataset, "run": "most-frequent", "model": "most-frequent caption", "method": "none",
            "objective": "none", "caption": caption}
    captions = {i: caption for i in refs}
    score_and_record(params, "most-frequent", info, captions, refs, args.out_captions, args.out_scores,
                     args.out_examples, extra={"vocabulary": caption_stats(captions, training_captions(annotations)),
                                               FAILURE_MODES: failure_modes(captions)})
