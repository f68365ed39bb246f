"""Set-level diversity of several captions per image (SLE paper, sec. 3.2).

For the caption set Y of one image (e.g. 5 random samples or the top-5 beams):

* Div-1: distinct unigrams in Y / number of words in Y (higher is more diverse);
* Div-2: distinct bigrams in Y / number of words in Y (higher is more diverse);
* mBLEU-4: each caption's BLEU-4 against the rest of Y as references (pycocoevalcap's
  sentence BLEU, closest reference length), averaged over the captions (lower is more
  diverse).

Each is computed per image and averaged over images. Captions are token lists.

Beside them, as self-critical.pytorch's ``eval_multi`` reports it, Self-CIDEr (Wang & Chan,
CVPR 2019; :mod:`caprl.evaluation.self_cider`): -log_m of the share of the largest root
eigenvalue of the set's CIDEr kernel (higher is more diverse, 0 to 1), on the PTB tokens
of the captions with document frequencies from the images' references.

Table 4's precision column is the official CIDEr-D, reduced per decoding as the paper
reports it (:data:`TABLE4_PRECISION`): for rs the mean over the 5 sampled captions (sec. 5.4:
"The reported CIDEr is the average of CIDEr scores of the 5 sampled captions"), for bs the
top beam's (its bs CIDEr equal Table 2's beam-5 CIDEr: SLL 115.0, SLL-ME 115.6, SLL-SLE 117.2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from caprl.errors import CaprlError
from caprl.evaluation.self_cider import self_cider
from caprl.rewards.bleu import leave_one_out_bleu


def div_n(captions: Sequence[Sequence[str]], n: int) -> float:
    """Distinct n-grams of the set over its number of words (0 for a set with no words)."""
    words = sum(len(c) for c in captions)
    if words == 0:
        return 0.0
    grams = {tuple(c[i : i + n]) for c in captions for i in range(len(c) - n + 1)}
    return len(grams) / words


def diversity(captions_per_image: Mapping[int, Sequence[Sequence[str]]]) -> dict[str, float]:
    """Div-1, Div-2 and mBLEU-4 averaged over images; every image needs at least 2 captions."""
    if not captions_per_image:
        raise CaprlError("diversity: no images given")
    groups = [list(caps) for caps in captions_per_image.values()]
    for image_id, caps in zip(captions_per_image, groups):
        if len(caps) < 2:
            raise CaprlError(f"diversity: image {image_id} has {len(caps)} caption(s); need at least 2")
    bleu4 = leave_one_out_bleu(groups)[:, 3]
    owner = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    mbleu = np.bincount(owner, bleu4) / np.bincount(owner)
    return {
        "Div-1": float(np.mean([div_n(g, 1) for g in groups])),
        "Div-2": float(np.mean([div_n(g, 2) for g in groups])),
        "mBLEU-4": float(mbleu.mean()),
    }


CaptionSets = Mapping[int, Sequence[Sequence[str]]]

#: How a decoding's per-caption CIDEr-D (one array per image, its set's order) becomes
#: Table 4's number: ``mean`` over every caption of every set; ``top`` = the mean over images
#: of each set's first caption (a beam set is sorted best first: the top beam's CIDEr-D).
PRECISIONS: dict[str, Callable[[list[np.ndarray]], float]] = {
    "mean": lambda per_image: float(np.concatenate(per_image).mean()),
    "top": lambda per_image: float(np.mean([scores[0] for scores in per_image])),
}
#: Paper 002's Table 4: rs CIDEr = the mean over the 5 samples (sec. 5.4); bs CIDEr = the top
#: beam's (equal to Table 2's beam-5 numbers), the run's main beam score when the widths match.
TABLE4_PRECISION: dict[str, str] = {"rs": "mean", "bs": "top"}


def set_scores(sets: CaptionSets, references: Mapping[int, Sequence[str]], precision: str) -> dict[str, float]:
    """Table 4's columns for one decoding: Div-1, Div-2, mBLEU-4 of each image's caption set,
    ``CIDEr-D`` reduced by ``precision`` (a key of :data:`PRECISIONS`) and ``CIDEr-D_mean``,
    the mean over every caption of every set (whatever ``precision``), and ``Self-CIDEr``.

    CIDEr-D is the official one: candidates and raw references PTB-tokenised by
    pycocoevalcap's tokenizer (one JVM call) and scored by our engine, which equals
    pycocoevalcap's CiderD with document frequencies from these references (its convention;
    so ``top`` on a beam set equals the official corpus CIDEr-D of the best beams).
    Self-CIDEr reads the same PTB tokens and document frequencies (as self-critical.pytorch's
    ``eval_self_cider`` tokenises both); Div-1, Div-2 and mBLEU-4 read the model's own words.
    """
    if precision not in PRECISIONS:
        raise CaprlError(f"diversity: unknown precision '{precision}'; known: {', '.join(sorted(PRECISIONS))}")
    refs, candidates = ptb_sets(sets, references)
    per_image = cider_d_of(refs, candidates)
    return {"CIDEr-D": PRECISIONS[precision](per_image), "CIDEr-D_mean": PRECISIONS["mean"](per_image),
            **diversity({i: sets[i] for i in sorted(sets)}), "Self-CIDEr": self_cider(candidates, refs)}


def official_cider_d(sets: CaptionSets, references: Mapping[int, Sequence[str]]) -> list[np.ndarray]:
    """The official CIDEr-D of every caption of every set (one array per image, sorted image ids,
    each in its set's order): candidates and raw references PTB-tokenised by pycocoevalcap's
    tokenizer (one JVM call) and scored by our engine with document frequencies from these
    references, as pycocoevalcap's CiderD does (``tests/test_evaluation_diversity.py``)."""
    return cider_d_of(*ptb_sets(sets, references))


def ptb_sets(sets: CaptionSets, references: Mapping[int, Sequence[str]]
             ) -> tuple[dict[int, list[list[str]]], dict[int, list[list[str]]]]:
    """(references, sets) of the sets' images, sorted image ids, PTB-tokenised by pycocoevalcap's
    tokenizer (one JVM call for what this process has not tokenised yet); a caption the tokenizer
    empties is []."""
    from caprl.metrics.official import ptb_tokenize

    ids = sorted(sets)
    missing = [i for i in ids if i not in references]
    if missing:
        raise CaprlError(f"diversity: no references for images {missing[:3]}")
    texts = {("ref", i): list(references[i]) for i in ids}
    texts.update({("cand", i, j): [" ".join(c)] for i in ids for j, c in enumerate(sets[i])})
    tokens = ptb_tokenize(texts)
    refs = {i: [r.split() for r in tokens[("ref", i)]] for i in ids}
    candidates = {i: [(tokens[("cand", i, j)] or [""])[0].split() for j in range(len(sets[i]))] for i in ids}
    return refs, candidates


def cider_d_of(refs: Mapping[int, Sequence[Sequence[str]]],
               candidates: Mapping[int, Sequence[Sequence[str]]]) -> list[np.ndarray]:
    """CIDEr-D of every tokenised candidate against its image's tokenised references (document
    frequencies from ``refs``), one array per image in ``candidates``' order."""
    from caprl.rewards import build_reward

    ids = list(candidates)
    owners = [i for i in ids for _ in candidates[i]]
    cider = build_reward("cider_d", refs)(owners, [c for i in ids for c in candidates[i]])
    return np.split(cider, np.cumsum([len(candidates[i]) for i in ids])[:-1])
