"""benchmarks/psst_tradeoff.py: Spearman's rho (ties by mean rank) and the per-seed overlap of Table 2's curves."""

from __future__ import annotations

import importlib.util
import math

from conftest import REPO

spec = importlib.util.spec_from_file_location("psst_tradeoff", REPO / "benchmarks" / "psst_tradeoff.py")
tradeoff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tradeoff)  # type: ignore[union-attr]


def test_spearman_by_hand_with_ties() -> None:
    assert tradeoff.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # ranks x = 1, 2, 3.5, 3.5 and y = 1, 3, 2, 4: Pearson of the ranks = 3 / sqrt(4.5 * 5)
    assert math.isclose(tradeoff.spearman([1, 2, 5, 5], [10, 30, 20, 40]), 3.0 / math.sqrt(4.5 * 5))
    assert tradeoff.spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(tradeoff.spearman([1, 1, 1], [1, 2, 3]))


def run(method: str, lam: float, cider: float, rho: float | None = None,
        name: str | None = None) -> tuple[str, dict[str, float], dict]:
    """A run's validation point and what its evaluation stored (method and options)."""
    name = name or f"synthetic/{method}-{lam}-{rho}"
    options = {"lam": lam, **({"rho": rho} if rho is not None else {})}
    return name, {"CIDEr-D": cider, "R@10": 0.5}, {"method": method, "options": options}


def test_table2_curves_overlap_only_where_every_span_meets() -> None:
    """Seed 1: every curve spans 1.7-1.9 (overlap); seed 2: ST Multinomial's tops at 1.6, below
    the others' lowest 1.7. The PSST rows are the ρ = 0.25 runs; other ρ and the XE run are not
    read. Method, λ and ρ come from the stored runs, never from their names (one is misnamed)."""
    def seed(st_multinomial_top: float) -> dict:
        points = [run(m, lam, c, 0.25 if m.startswith("psst") else None)
                  for m in tradeoff.TABLE2 for lam, c in ((0.1, 1.7), (0.9, 1.9))]
        points += [run("st_multinomial", 0.1, 1.5), run("st_multinomial", 0.9, st_multinomial_top),
                   run("psst_multinomial", 0.5, 2.5, 1.0, name="synthetic/fc-st_gumbel-lam0_5"),
                   ("synthetic/fc-xe", {"CIDEr-D": 3.0}, {"method": "xe", "options": {"lr": 0.003}})]
        return {"validation": {n: v for n, v, _ in points}, "runs": {n: info for n, _, info in points}}

    stored = {"per_seed": {"1": seed(1.8), "2": seed(1.6)}}
    pts = tradeoff.points(stored)
    assert ("psst_multinomial", 1.0) in pts and ("xe", None) not in pts
    assert len(pts[("st_gumbel", None)]) == 4  # the misnamed ρ = 1 PSST run is not ST Gumbel's
    assert tradeoff.overlap_by_seed(pts) == {1: (1.7, 1.8), 2: (1.7, 1.6)}
