"""CIDEr-D reward throughput and memory: caprl vs pycocoevalcap's CiderScorer, same batches.

    python benchmarks/rewards.py [--batches N] [--repeats R] [--captions PATH] [--check]

References: the COCO Karpathy test split (PTB-tokenised once with pycocoevalcap). Each
batch is 50 images x 6 candidates; a candidate is one of the image's references with ~30%
of its tokens resampled from the corpus vocabulary (seeded). Both implementations take
document frequencies from all references of the split. pycocoevalcap's CiderScorer is
driven the way self-critical.pytorch drives it (references cooked per batch, corpus
``document_frequency`` set on the scorer); its ``compute_cider`` always uses
``ref_len = log(batch size)``, so the agreement check scores the first batch with caprl
given the same ``num_documents``.

Then the memory-growth check: 1,000 batches of captions made only of unseen words.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from caprl.metrics.official import ptb_tokenize
from caprl.rewards import build_reward, compute_document_frequencies
from caprl.rewards.document_frequencies import DocumentFrequencies

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CAPTIONS = REPO / "../shared/data/coco/karpathy_test5k_captions.json"

Batch = tuple[list[int], list[list[str]]]


def load_references(path: Path) -> dict[int, list[list[str]]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    raw: dict[int, list[str]] = defaultdict(list)
    for ann in data["annotations"]:
        raw[ann["image_id"]].append(ann["caption"])
    tokens = ptb_tokenize(raw)
    return {i: [s.split() for s in caps] for i, caps in tokens.items()}


def make_batches(refs: dict[int, list[list[str]]], n: int, images: int, per_image: int, seed: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    ids = list(refs)
    vocab = sorted({w for caps in refs.values() for c in caps for w in c})
    batches = []
    for b in range(n):
        chosen = [ids[(b * images + k) % len(ids)] for k in range(images)]
        image_ids, captions = [], []
        for i in chosen:
            for _ in range(per_image):
                cap = list(refs[i][rng.integers(len(refs[i]))])
                for t in np.flatnonzero(rng.random(len(cap)) < 0.3):
                    cap[t] = vocab[rng.integers(len(vocab))]
                image_ids.append(i)
                captions.append(cap)
        batches.append((image_ids, captions))
    return batches


def pycocoevalcap_cider(refs: dict[int, list[list[str]]], df: DocumentFrequencies) -> Callable[[Batch], np.ndarray]:
    from pycocoevalcap.cider.cider_scorer import CiderScorer

    corpus_df = defaultdict(float, {k: float(v) for k, v in df.to_dict().items()})
    ref_strings = {i: [" ".join(c) for c in caps] for i, caps in refs.items()}

    def score(batch: Batch) -> np.ndarray:
        scorer = CiderScorer(n=4, sigma=6.0)
        for image_id, caption in zip(*batch):
            scorer.cook_append(" ".join(caption), ref_strings[image_id])
        scorer.document_frequency = corpus_df
        return np.asarray(scorer.compute_cider())

    return score


def throughput(fns: dict[str, Callable[[Batch], object]], batches: list[Batch]) -> dict[str, float]:
    """Captions per second of each function; batches are interleaved so both see the same load."""
    for fn in fns.values():
        fn(batches[0])  # warm-up
    seconds = dict.fromkeys(fns, 0.0)
    for batch in batches:
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(batch)
            seconds[name] += time.perf_counter() - start
    n_caps = sum(len(b[1]) for b in batches)
    return {name: n_caps / s for name, s in seconds.items()}


def peak_mib(fn: Callable[[Batch], object], batches: list[Batch]) -> float:
    """Peak traced MiB above the starting point while scoring (up to) 5 batches."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for batch in batches[:5]:
        fn(batch)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak / 2**20


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def growth_check(reward: Any, n_batches: int, seed: int) -> tuple[list[tuple[int, float]], float, float]:
    """Score ``n_batches`` of never-seen words after a warm-up.

    Returns the traced MiB still allocated (tracemalloc, started after the warm-up) at
    checkpoints ``[(batches done, MiB), ...]``, and RSS MiB at start and end.
    """
    rng = np.random.default_rng(seed)
    image_ids = list(reward.refs.image_ids[:50]) * 6

    def batch() -> list[list[str]]:
        numbers = rng.integers(10**12, size=(len(image_ids), 16)).tolist()
        return [[f"unseen{x}" for x in row[: 5 + k % 12]] for k, row in enumerate(numbers)]

    for _ in range(10):
        reward(image_ids, batch())
    gc.collect()
    start_rss = rss_mib()
    tracemalloc.start()
    marks = {max(1, n_batches // 4), max(1, n_batches // 2), n_batches}
    traced = [(0, 0.0)]
    for done in range(1, n_batches + 1):
        reward(image_ids, batch())
        if done in marks:
            gc.collect()
            traced.append((done, tracemalloc.get_traced_memory()[0] / 2**20))
    tracemalloc.stop()
    return traced, start_rss, rss_mib()


def pairwise_section(batches: list[Batch], candidates: int, limit: int = 20) -> None:
    """SLE's diversity term: BLEU-3/4 of every sample against each other sample of its image.
    caprl's batched ``pairwise_bleu`` against pycocoevalcap's BleuScorer, one pair at a time
    (how a straightforward SLE implementation would call it), on the first ``limit`` batches."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    from caprl.rewards import pairwise_bleu

    groups_of = [[caps[i * candidates:(i + 1) * candidates] for i in range(len(caps) // candidates)]
                 for _, caps in batches[:limit]]

    def official(groups: list[list[list[str]]]) -> list[np.ndarray]:
        out = []
        for group in groups:
            pair = np.full((len(group), len(group), 4), np.nan)
            for j, a in enumerate(group):
                for k, b in enumerate(group):
                    if j != k:
                        scorer = BleuScorer(n=4)
                        scorer += (" ".join(a), [" ".join(b)])
                        pair[j, k] = np.asarray(scorer.compute_score(option="closest", verbose=0)[1])[:, 0]
            out.append(pair)
        return out

    times = {}
    for name, fn in (("caprl pairwise_bleu", pairwise_bleu), ("pycocoevalcap, pair by pair", official)):
        start = time.perf_counter()
        results = [fn(groups) for groups in groups_of]
        times[name] = time.perf_counter() - start
        if name.startswith("caprl"):
            ours = results
    diff = max(float(np.nanmax(np.abs(a - b))) for ours_b, base_b in zip(ours, results)
               for a, b in zip(ours_b, base_b))
    pairs = sum(len(g) * (len(g) - 1) for groups in groups_of for g in groups)
    print(f"\nSLE pairwise BLEU-1..4 within each image's {candidates} candidates, {len(groups_of)} batches = {pairs} pairs")
    print(f"{'implementation':<28}{'pairs/s':>14}")
    for name, seconds in times.items():
        print(f"{name:<28}{pairs / seconds:>14,.0f}")
    ratio = times["pycocoevalcap, pair by pair"] / times["caprl pairwise_bleu"]
    print(f"{'ratio (caprl / pycocoevalcap)':<28}{ratio:>13.1f}x")
    print(f"max |caprl - pycocoevalcap|: {diff:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captions", type=Path, default=DEFAULT_CAPTIONS, help="COCO caption annotations JSON")
    parser.add_argument("--batches", type=int, default=100, help="timed batches per implementation (default 100)")
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1, help="time the batches this many times; report the best")
    parser.add_argument("--growth-batches", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="exit 1 unless speed-up >= 30x and memory is flat")
    args = parser.parse_args(argv)

    path = args.captions.resolve()
    if not path.exists():
        print(f"captions file not found: {path}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    refs = load_references(path)
    df = compute_document_frequencies(refs)
    t1 = time.perf_counter()
    reward = build_reward("cider_d", refs, df)
    t2 = time.perf_counter()
    print(f"references: {len(refs)} images from {path.name}; PTB + df {t1 - t0:.1f}s; caprl build {t2 - t1:.2f}s")
    batches = make_batches(refs, args.batches, args.images, args.candidates, args.seed)
    table_size, n_words = reward.refs.table.size, len(reward.refs.word_index)  # type: ignore[attr-defined]

    # agreement on the first batch (pycocoevalcap's ref_len is log(batch size))
    baseline = pycocoevalcap_cider(refs, df)
    same_n = DocumentFrequencies(df.words, df.ngrams, df.counts, len(batches[0][1]))
    diff = np.abs(build_reward("cider_d", refs, same_n)(*batches[0]) - baseline(batches[0])).max()

    ours = lambda b: reward(*b)  # noqa: E731
    rounds = [throughput({"caprl": ours, "pycocoevalcap": baseline}, batches) for _ in range(max(1, args.repeats))]
    best = max(rounds, key=lambda r: r["caprl"] / r["pycocoevalcap"])
    ours_rate, base_rate = best["caprl"], best["pycocoevalcap"]
    ours_peak, base_peak = peak_mib(ours, batches), peak_mib(baseline, batches)
    ratio = ours_rate / base_rate
    n_caps = sum(len(b[1]) for b in batches)
    repeats = f", best of {len(rounds)} interleaved rounds" if len(rounds) > 1 else ", interleaved"
    shape = f"{len(batches)} batches x {args.images} images x {args.candidates} candidates"
    print(f"\nCIDEr-D, {shape} = {n_caps} captions{repeats}")
    print(f"{'implementation':<28}{'captions/s':>14}{'peak MiB':>12}")
    print(f"{'caprl CiderD':<28}{ours_rate:>14,.0f}{ours_peak:>12.2f}")
    print(f"{'pycocoevalcap CiderScorer':<28}{base_rate:>14,.0f}{base_peak:>12.2f}")
    print(f"{'ratio (caprl / pycocoevalcap)':<28}{ratio:>13.1f}x")
    print(f"max |caprl - pycocoevalcap| on batch 0: {diff:.2e}")
    pairwise_section(batches, args.candidates)

    traced, s_rss, e_rss = growth_check(reward, args.growth_batches, args.seed)
    growth = traced[-1][1] - traced[0][1]
    print(f"\nmemory over {args.growth_batches} batches of unseen n-grams (after a 10-batch warm-up):")
    print("  still allocated (tracemalloc): " + ", ".join(f"{mib:.3f} MiB after {n}" for n, mib in traced))
    print(f"  RSS: {s_rss:.1f} MiB -> {e_rss:.1f} MiB ({e_rss - s_rss:+.1f} MiB)")
    table = reward.refs.table  # type: ignore[attr-defined]
    words = len(reward.refs.word_index)  # type: ignore[attr-defined]
    print(f"  table: {table.size} n-grams, {words} words (unchanged: {table.size == table_size and words == n_words})")
    ok = ratio >= 30 and growth < 0.5 and diff < 1e-9
    print(f"\n{'PASS' if ok else 'FAIL'}: speed-up {ratio:.1f}x (need >= 30x), traced growth {growth:+.3f} MiB")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
