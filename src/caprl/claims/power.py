"""How many seeds a claim needs, fixed before the main run (``caprl claims-plan --pilot DIR``).

A claim's verdict holds when the 95% interval of its paired differences over the seeds excludes 0:
a two-sided paired t-test at alpha 0.05. Given the spread of those differences in a pilot (an earlier
claims result: its per-claim standard deviation over its seeds) and the effect the paper reports
(its two numbers, ``a vs b`` or ``b -> a`` in the claim's source, times the side's ``scale``; or the
claim's ``paper_effect``), the seeds needed are the smallest n at which that test has 80% power
(statsmodels' ``TTestPower``: the paired test is a one-sample t-test on the differences). Printed so
the seed count is fixed before the main run, never raised after looking at its result.
"""

from __future__ import annotations

import math
import re
from typing import Any

ALPHA, POWER, MAX_SEEDS = 0.05, 0.8, 1000
# "<a> vs <b>" or "<a> -> <b>", words between ("120.4 vs Stack-Cap* (C2F) 115.9"): b a number standing alone
_NUMBERS = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)\s*(?:vs\.?|->)\s*(?:[^;\"]*?\s)??(-?\d+(?:\.\d+)?)(?![\w.])")


def paper_effect(claim: dict[str, Any]) -> tuple[float, str] | None:
    """The effect the paper reports, in the claim's units and sign (positive: as claimed), with the
    text it was read from; None where the source states no two numbers."""
    if "paper_effect" in claim:
        return float(claim["paper_effect"]), "paper_effect"
    match = _NUMBERS.search(str(claim.get("source", "")))
    if not match:
        return None
    a, b = float(match.group(1)), float(match.group(2))
    if "->" in match.group(0):  # "b -> a": from the baseline to the claimed method
        a, b = b, a
    scale = float(claim["a"].get("scale", 1.0)) if isinstance(claim["a"], dict) else 1.0
    diff = (b - a if claim["kind"] == "less" else a - b) * scale
    if claim["kind"] == "at_least":
        diff += float(claim.get("margin", 0.0))
    return diff, match.group(0)


def t_power(n: int, size: float) -> float:
    """Power of the two-sided one-sample t-test at ALPHA with n observations and standardised effect
    ``size``: P(|T'| > t_crit), T' noncentral t (n - 1 df, noncentrality size * sqrt(n)); statsmodels'
    ``TTestPower.power``, which is NaN where scipy's noncentral t is (1 df, large effects): there the
    same probability by integrating over the chi-square of the denominator."""
    from scipy import integrate, stats
    from statsmodels.stats.power import TTestPower

    value = float(TTestPower().power(effect_size=size, nobs=n, alpha=ALPHA, alternative="two-sided"))
    if math.isfinite(value):
        return value
    df, nc = n - 1, size * math.sqrt(n)
    crit = float(stats.t.ppf(1 - ALPHA / 2, df))

    def rejected(u: float) -> float:  # P(reject | the chi-square at its quantile u): bounded, smooth in u
        scale = crit * math.sqrt(float(stats.chi2.ppf(u, df)) / df)
        return float(stats.norm.sf(scale - nc) + stats.norm.cdf(-scale - nc))

    return float(integrate.quad(rejected, 0.0, 1.0, limit=200)[0])


def seeds_needed(effect: float, sd: float) -> int | None:
    """The smallest number of seeds at which a two-sided paired t-test at ALPHA detects ``effect``
    with POWER, given the differences' standard deviation ``sd``; None above MAX_SEEDS."""
    if sd == 0.0:
        return 2
    size = abs(effect) / sd
    if t_power(MAX_SEEDS, size) < POWER:
        return None
    low, high = 2, MAX_SEEDS  # power grows with n: bisect for the first n that reaches POWER
    while low < high:
        mid = (low + high) // 2
        if t_power(mid, size) >= POWER:
            high = mid
        else:
            low = mid + 1
    return low


def claim_power(config: dict[str, Any], pilot: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per claim of the config: the paper's effect, the pilot's sd and seed count, the seeds needed."""
    stored = {r["id"]: r for r in (pilot or {}).get("results", [])}
    rows = []
    for claim in config["claims"]:
        effect = paper_effect(claim)
        result = stored.get(claim["id"])
        sd = float(result["sd"]) if result and result.get("sd") is not None else math.nan
        row = {"id": claim["id"], "effect": effect[0] if effect else None, "read_from": effect[1] if effect else None,
               "pilot_sd": None if math.isnan(sd) else sd, "pilot_seeds": result["n_read"] if result else None}
        if effect is None:
            row["needed"], row["why"] = None, "the paper states no two numbers for it"
        elif result is None or math.isnan(sd):
            row["needed"], row["why"] = None, "no pilot spread (not in the pilot, or a seed without a value)"
        else:
            row["needed"] = seeds_needed(effect[0], sd)
            row["why"] = None if row["needed"] else f"more than {MAX_SEEDS} seeds"
        rows.append(row)
    return rows


def power_markdown(paper: str, rows: list[dict[str, Any]], seeds: int) -> list[str]:
    """One table row per claim (``| paper | claim | effect | sd | seeds needed |``)."""
    out = []
    for r in rows:
        effect = "—" if r["effect"] is None else f"{r['effect']:+.3g} ({r['read_from']})"
        sd = "—" if r["pilot_sd"] is None else f"{r['pilot_sd']:.3g} ({r['pilot_seeds']} seeds)"
        needed = str(r["needed"]) if r["needed"] else r["why"]
        flag = " (more than the config's)" if r["needed"] and r["needed"] > seeds else ""
        out.append(f"| {paper} | {r['id']} | {effect} | {sd} | {needed}{flag} |")
    return out
