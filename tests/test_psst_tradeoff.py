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


def run(method: str, lam: str, cider: float, rho: str | None = None) -> tuple[str, dict[str, float]]:
    name = f"synthetic/fc-{method}-lam{lam}" + (f"-rho{rho}" if rho else "")
    return name, {"CIDEr-D": cider, "R@10": 0.5}


def test_table2_curves_overlap_only_where_every_span_meets() -> None:
    """Seed 1: every curve spans 1.7-1.9 (overlap); seed 2: ST Multinomial's tops at 1.6, below
    the others' lowest 1.7. The PSST rows are the ρ = 0.25 runs; other ρ and the XE run are not read."""
    def seed(st_multinomial_top: float) -> dict:
        validation = dict(run(m, lam, c, "0_25" if m.startswith("psst") else None)
                          for m in tradeoff.TABLE2 for lam, c in (("0_1", 1.7), ("0_9", 1.9)))
        validation.update([run("st_multinomial", "0_1", 1.5), run("st_multinomial", "0_9", st_multinomial_top),
                           run("psst_multinomial", "0_5", 2.5, "1"), ("synthetic/fc-xe", {"CIDEr-D": 3.0})])
        return {"validation": validation}

    stored = {"per_seed": {"1": seed(1.8), "2": seed(1.6)}}
    pts = tradeoff.points(stored)
    assert ("psst_multinomial", "1") in pts and ("xe", None) not in pts
    assert tradeoff.overlap_by_seed(pts) == {1: (1.7, 1.8), 2: (1.7, 1.6)}
