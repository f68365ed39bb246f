"""Does λ trade naturalness for discriminability on the claims run of paper 004? From its stored values.

    python benchmarks/psst_tradeoff.py [--claims results/claims/004.json]

Paper 004 compares its methods "at matched CIDEr" because each method's λ traces a curve from
natural (low λ: high CIDEr-D, low recall) to discriminative (high λ). This reads every run's
validation point (val CIDEr-D of its evaluation decoding, val R@10 of its greedy captions: the
numbers the operating points are chosen on) from the per-seed values the claims (``snakemake claims_004``)
stored, and prints, per method (and ρ), over every seed and λ: Spearman's rank correlation of λ
with val CIDEr-D, of λ with val R@10, and of val CIDEr-D with val R@10 (a trade-off: negative);
then, per seed, whether Table 2's six validation curves overlap in CIDEr-D at all (the highest of
their lowest values against the lowest of their highest). No training: seconds.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE2 = ["luo2018", "reinforce_joint", "st_gumbel", "st_multinomial", "psst_gumbel", "psst_multinomial"]
TABLE_RHO = 0.25  # discriminative.table_rho of the claims config: the PSST rows of Table 2


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (nan when either side is constant)."""
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def points(stored: dict) -> dict[tuple[str, float | None], list[tuple[int, float, float, float]]]:
    """(method, ρ) -> [(seed, λ, val CIDEr-D, val R@10)] of every run with a λ and both validation
    numbers; method, λ and ρ as the run's evaluation stored them (never read off its name)."""
    out: dict[tuple[str, float | None], list[tuple[int, float, float, float]]] = defaultdict(list)
    for seed, values in stored["per_seed"].items():
        for run, val in values.get("validation", {}).items():
            info = values.get("runs", {}).get(run, {})
            options = info.get("options", {})
            if "lam" in options and "CIDEr-D" in val and "R@10" in val:
                out[(info["method"], options.get("rho"))].append((int(seed), float(options["lam"]), val["CIDEr-D"],
                                                                   val["R@10"]))
    return out


def overlap_by_seed(pts: dict[tuple[str, float | None], list[tuple[int, float, float, float]]]) -> dict[int, tuple[float, float]]:
    """seed -> (highest lowest, lowest highest) val CIDEr-D of Table 2's six curves: they overlap
    where the first is at most the second."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for method in TABLE2:
        rho = TABLE_RHO if method.startswith("psst") else None
        by_seed: dict[int, list[float]] = defaultdict(list)
        for seed, _, cider, _ in pts.get((method, rho), []):
            by_seed[seed].append(cider)
        for seed, ciders in by_seed.items():
            spans[seed].append((min(ciders), max(ciders)))
    return {seed: (max(lo for lo, _ in s), min(hi for _, hi in s)) for seed, s in sorted(spans.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=Path, default=REPO / "results" / "claims" / "004.json")
    args = parser.parse_args(argv)
    stored = json.loads(args.claims.read_text())
    pts = points(stored)
    print(f"{stored['meta']['commit']}, {len(stored['per_seed'])} seeds; Spearman's rho over every seed and λ")
    print(f"{'method (ρ)':<24} {'runs':>4} {'λ~CIDEr-D':>10} {'λ~R@10':>8} {'CIDEr-D~R@10':>13}")
    for (method, rho), p in sorted(pts.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0.0)):
        lam, cider, r10 = [x[1] for x in p], [x[2] for x in p], [x[3] for x in p]
        name = method + (f" ({rho:g})" if rho is not None else "")
        print(f"{name:<24} {len(p):>4} {spearman(lam, cider):>10.2f} {spearman(lam, r10):>8.2f} "
              f"{spearman(cider, r10):>13.2f}")
    print("\nTable 2's validation curves in CIDEr-D, per seed: highest lowest vs lowest highest")
    for seed, (lo, hi) in overlap_by_seed(pts).items():
        print(f"seed {seed}: {lo:.3f} vs {hi:.3f}: {'overlap' if lo <= hi else 'no common CIDEr-D'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
