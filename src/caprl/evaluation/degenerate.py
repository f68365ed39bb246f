"""Degenerate caption sets: empty captions, one caption for every image, few distinct captions.

A model that collapsed (nothing, or the same words, for every image) is still scored, and
its numbers look like any other row's. ``caprl evaluate`` stores what :func:`check` finds in
the score file as ``warnings``, a list of ``{"kind", "message", ...counts}``; the tables mark
the run's rows with :data:`caprl.tables.render.FLAG` and a footnote per warning.

Kinds: ``empty_captions`` (``count``, ``fraction``: any caption with no word),
``same_caption`` (``caption``: every image has one caption, at least two images) and
``few_distinct`` (``distinct``, ``fraction``: fewer than :data:`MIN_DISTINCT_FRACTION` of
the captions differ). The trivial baseline (``caprl baseline``) gives one caption to every
image by design and is not checked.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Mapping

log = logging.getLogger(__name__)

# Below this fraction of distinct captions a model says nearly the same thing of every image.
# Trained captioners give far more (on COCO, typically a third or more of the test captions
# differ); a split of fewer than 1 / MIN_DISTINCT_FRACTION images is only checked for one caption.
MIN_DISTINCT_FRACTION = 0.05


def _quote(caption: str, limit: int = 60) -> str:
    return repr(caption if len(caption) <= limit else caption[:limit] + "...")


def degenerate_warnings(captions: Mapping[int, str], split: str = "test") -> list[dict[str, Any]]:
    """What is degenerate about ``captions`` (image id -> caption) of ``split``; [] if nothing."""
    n = len(captions)
    if n == 0:
        return []
    texts = [" ".join(c.split()) for c in captions.values()]
    warnings: list[dict[str, Any]] = []
    empty = sum(not t for t in texts)
    if empty:
        what = "every caption is" if empty == n else f"{empty} of the {n} {split} captions are"
        warnings.append({"kind": "empty_captions", "count": empty, "fraction": empty / n,
                         "message": f"{what} empty ({100.0 * empty / n:.1f}%)"})
    counts = Counter(texts)
    if n >= 2 and len(counts) == 1 and texts[0]:
        warnings.append({"kind": "same_caption", "caption": texts[0],
                         "message": f"every one of the {n} {split} images got the same caption {_quote(texts[0])}"})
    elif len(counts) > 1 and len(counts) < MIN_DISTINCT_FRACTION * n:
        top, times = counts.most_common(1)[0]
        warnings.append({"kind": "few_distinct", "distinct": len(counts), "fraction": len(counts) / n,
                         "message": f"only {len(counts)} distinct captions for {n} {split} images "
                                    f"({100.0 * len(counts) / n:.1f}%, below {100.0 * MIN_DISTINCT_FRACTION:g}%); "
                                    f"the most common, {_quote(top)}, for {times}"})
    return warnings


def check(captions: Mapping[int, str], label: str, split: str = "test") -> list[dict[str, Any]]:
    """:func:`degenerate_warnings`, each also logged as a WARNING naming ``label`` (the run)."""
    warnings = degenerate_warnings(captions, split)
    for warning in warnings:
        log.warning("%s: degenerate captions: %s (its scores are flagged in the score file and the tables)",
                    label, warning["message"])
    return warnings
