"""Self-CIDEr: the diversity of one image's caption set from its CIDEr self-similarity kernel.

Wang & Chan, "Describing like Humans: on Diversity in Image Captioning" (CVPR 2019,
arXiv:1903.12020, sec. 3): latent semantic analysis of a caption set, kernelised with CIDEr.
For the m captions c_1..c_m of one image (their PTB tokens)::

    K_ij       = CIDEr(c_i, c_j) / 10 = mean_{n=1..4} cos(g_n(c_i), g_n(c_j))
    r          = sqrt(lambda_max) / sum_i sqrt(lambda_i)     (lambda: eigenvalues of K, clipped at 0)
    Self-CIDEr = -log_m(r) = -log(r) / log(m)

``g_n(c)`` is the tf-idf vector of c's n-grams of order n, ``g(w) = tf(w) * (log N - log
max(1, df(w)))``, with document frequencies over the N images of the references (each image
one document). A cosine with a zero-norm vector is the bare dot product (0), as in CIDEr.
Identical captions give a rank-one K (r = 1, Self-CIDEr 0); m captions that share no weighted
n-gram and have equal self-similarity (every one of 4 words or more: K = I) give r = 1/m,
Self-CIDEr 1, the maximum.

As self-critical.pytorch computes it (``captioning/utils/eval_multi.py``: ``eval_self_cider``
and its ``get_div``; the kernel from ``cider/pyciderevalcap/cider/cider_scorer.py``:
``my_get_self_cider`` with ``counts2vec`` and ``sim``): CIDEr's cosine, not CIDEr-D's (no
length penalty, no clipping), so K is symmetric; SCP scales its CIDEr matrix (x 10) back by
1/10 before taking the eigenvalues. Two choices of ours: the document frequencies come from
the references of the scored split (the convention of caprl's official CIDEr-D; SCP takes
every image of the annotation file it is given, for COCO val2014), and a set whose kernel is
all zeros (no caption has a weighted n-gram, e.g. every caption empty) scores 0, where SCP's
division gives NaN. Written from the formula, not copied.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.document_frequencies import compute_document_frequencies

ORDERS = 4  # CIDEr's n-gram orders 1..4
Vectors = list[dict[tuple[str, ...], float]]  # one tf-idf vector per n-gram order


def tfidf_vectors(caption: Sequence[str], df: Mapping[tuple[str, ...], int], log_documents: float) -> Vectors:
    """The caption's tf-idf vector of each order: tf(g) * (log N - log max(1, df(g)))."""
    counts = Counter(tuple(caption[i:i + n]) for n in range(1, ORDERS + 1) for i in range(len(caption) - n + 1))
    vectors: Vectors = [{} for _ in range(ORDERS)]
    for gram, tf in counts.items():
        vectors[len(gram) - 1][gram] = tf * (log_documents - math.log(max(1.0, df.get(gram, 0))))
    return vectors


def cider_kernel(captions: Sequence[Sequence[str]], df: Mapping[tuple[str, ...], int],
                 num_documents: int) -> np.ndarray:
    """K_ij = the mean over the orders of the cosine of captions i and j's tf-idf vectors."""
    vectors = [tfidf_vectors(c, df, math.log(num_documents)) for c in captions]
    kernel = np.zeros((len(captions), len(captions)))
    for n in range(ORDERS):
        grams = sorted({g for v in vectors for g in v[n]})
        index = {g: j for j, g in enumerate(grams)}
        matrix = np.zeros((len(captions), len(grams)))
        for i, v in enumerate(vectors):
            for gram, weight in v[n].items():
                matrix[i, index[gram]] = weight
        dots = matrix @ matrix.T
        norms = np.linalg.norm(matrix, axis=1)
        denom = np.outer(norms, norms)
        kernel += dots / np.where(denom != 0, denom, 1.0)  # a zero norm leaves the dot product (0)
    return kernel / ORDERS


def kernel_diversity(kernel: np.ndarray) -> float:
    """-log_m(sqrt(lambda_max) / sum sqrt(lambda)) of an m x m kernel (m >= 2); 0 for a zero kernel."""
    m = kernel.shape[0]
    if m < 2:
        raise CaprlError(f"Self-CIDEr: a set of {m} caption(s) has no diversity; need at least 2")
    roots = np.sqrt(np.clip(np.linalg.eigvalsh(kernel), 0.0, None))
    total = roots.sum()
    if total == 0.0:
        return 0.0
    return float(-np.log(roots.max() / total) / np.log(m)) + 0.0  # never -0.0


def self_cider(sets: Mapping[int, Sequence[Sequence[str]]],
               references: Mapping[int, Sequence[Sequence[str]]]) -> float:
    """Self-CIDEr of every image's caption set, averaged over the images; document frequencies
    over ``references`` (image id -> tokenised reference captions, one document per image)."""
    if not sets:
        raise CaprlError("Self-CIDEr: no images given")
    frequencies = compute_document_frequencies(references)
    df = frequencies.to_dict()
    return float(np.mean([kernel_diversity(cider_kernel(sets[i], df, frequencies.num_documents))
                          for i in sorted(sets)]))
