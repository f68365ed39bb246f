"""Vocabulary used and novel captions of a run's evaluated captions (one per image).

What self-critical.pytorch's ``language_eval`` reports beside the metrics
(``captioning/utils/eval_utils.py``: ``vocab_size`` = the distinct words of the generated
captions; ``novel_sentences`` = the share of generated captions that are no training
caption verbatim, the training captions being the ``tokens`` of every sentence of an image
outside val and test, joined by spaces; over its ``sample_n`` captions per image). Here, of the
captions the evaluation scores (one per image, so every run has them), compared with the
token lists of the annotations' ``train`` split (``caprl prepare`` folds Karpathy's restval
into train), joined by spaces as the model's captions are.

One difference: SCP divides the number of *distinct* novel captions by the number of
captions; here every scored caption counts (two images given the same novel caption count
twice), so ``novel_sentences`` is the share of the scored captions. An empty caption is no
training caption (every training caption has words), so it counts as novel; such runs are
flagged degenerate (:mod:`caprl.evaluation.degenerate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from caprl.data.annotations import references_from_annotations
from caprl.errors import CaprlError

TRAIN_SPLIT = "train"  # the split whose captions a caption must not repeat to be novel


def training_captions(annotations: dict[str, Any]) -> set[str]:
    """The distinct training captions of a normalised annotations dict, tokens joined by spaces."""
    return {" ".join(c) for caps in references_from_annotations(annotations, TRAIN_SPLIT).values() for c in caps}


def caption_stats(captions: Mapping[int, str], training: Iterable[Sequence[str]] | set[str]) -> dict[str, Any]:
    """``vocab_size`` (distinct words of ``captions``, image id -> caption with words separated by
    spaces), ``novel_sentences`` (the share of them that is no ``training`` caption verbatim: a
    set of space-joined captions or token lists), and the counts behind them."""
    if not captions:
        raise CaprlError("vocabulary: no captions given")
    known = training if isinstance(training, set) else {" ".join(c) for c in training}
    texts = [" ".join(str(c).split()) for c in captions.values()]
    novel = sum(text not in known for text in texts)
    return {"vocab_size": len({w for text in texts for w in text.split()}), "novel_sentences": novel / len(texts),
            "captions": len(texts), "novel_captions": novel, "training_captions": len(known)}
