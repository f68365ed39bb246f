"""How a claim is decided and printed (for ``benchmarks/claims.py``): each seed's value of a claim's
two sides (a score file's metric or a table cell), the paired differences' mean and 95% Student-t
interval over every seed of the config, the verdict, and the paper's page. No workflow, no git."""

from __future__ import annotations

import csv
import io
import math
import re
from typing import Any

PERCENT = ("metrics.", "lookahead.metrics.", "diversity.rs.CIDEr-D", "diversity.bs.CIDEr-D")
KINDS = ("greater", "less", "at_least")
OPERATORS = {"greater": ">", "less": "<", "at_least": "≥"}
LEGEND = ("The difference d is a - b (b - a for '<'), per seed; its mean and 95% Student-t interval are over "
          "every seed of the config (the seeds column). Verdict: '>' and '<' claims **hold** if the interval "
          "lies above 0 and are **reversed** if it lies below 0; a '≥' claim (margin m: the paper says "
          "\"comparable\") **holds** if the interval lies above -m (a not worse than b by m or more) and is "
          "**reversed** if it lies below -m; else **unresolved**. A seed without a value on either side (a "
          "missing run or metric, an empty table cell: a curve not reaching the operating point) makes the "
          "claim unresolved, the seed named: never a verdict on the other seeds.")


def ref_dataset(claim: dict[str, Any], ref: dict[str, Any]) -> str:
    return ref.get("dataset", claim.get("dataset", "synthetic"))


class Missing(Exception):
    """A side of a claim has no value in a seed; the message says why."""


def table_cell(csv_text: str, row: str, column: str, where: str) -> float:
    """The cell's number; nan where it shows none (—). KeyError: no such row or column."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    header = rows[0]
    if column not in header:
        raise KeyError(f"{where}: no column {column!r} (columns: {header})")
    for line in rows[1:]:
        if line[0] == row:
            text = line[header.index(column)]
            return float(re.sub(r"[^0-9.eE+-]", "", text)) if text.strip() not in ("", "—") else math.nan
    raise KeyError(f"{where}: no row {row!r} (rows: {[r[0] for r in rows[1:]]})")


def empty_cell_reason(seed: dict[str, Any], key: str, row: str, column: str) -> str:
    """Why a table cell is empty: the table's note on the row (e.g. its curve's range against the
    operating point), else the bare fact."""
    notes = seed.get("table_notes", {}).get(key, [])
    own = [n for n in notes if n.startswith(f"{row}, {column}:")] or [n for n in notes if n.startswith(f"{row}:")]
    own.sort(key=lambda n: " spans " not in n)  # a curve's range against the point first
    table = key.split("/", 1)[1]
    if own:
        detail = own[0].split(": ", 1)[1].rstrip(".")
        if " spans " in detail:
            return f"{row}'s curve does not reach the operating point ({table}, {column}: {detail})"
        return f"{row} has no value in {table}, {column} ({detail})"
    return f"{table} has no value in row {row!r}, column {column!r}"


def value_of(seed: dict[str, Any], claim: dict[str, Any], side: str) -> float:
    """Side ``a`` or ``b`` of a claim in one seed's results; :class:`Missing` (with the reason)
    where it has none. ``b_metric`` names another metric of side b (e.g. lookahead against beam
    search of one run)."""
    ref = claim[side]
    if isinstance(ref, dict):
        key = f"{ref_dataset(claim, ref)}/{ref['table']}"
        if key not in seed.get("tables", {}):
            raise Missing(seed.get("tables_reason") or f"no table {key}")
        try:
            value = table_cell(seed["tables"][key], ref["row"], ref["column"], key)
        except KeyError as exc:
            raise Missing(str(exc.args[0])) from None
        if math.isnan(value):
            raise Missing(empty_cell_reason(seed, key, ref["row"], ref["column"]))
        return value * float(ref.get("scale", 1.0))
    path = claim.get(f"{side}_metric", claim["metric"])
    if ref not in seed.get("runs", {}):
        raise Missing(f"run {ref} has no scores")
    value: Any = seed["runs"][ref]
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise Missing(f"run {ref} has no {path}")
        value = value[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(float(value)):
        raise Missing(f"run {ref}'s {path} is not a number ({value!r})")
    return float(value) * (100.0 if path.startswith(PERCENT) else 1.0)


def t_quantile(df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def interval(diffs: list[float]) -> tuple[float, float, float, float]:
    """Mean, standard deviation and the 95% Student-t interval of the paired differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else math.nan
    half = t_quantile(n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    return mean, sd, mean - half, mean + half


def verdict(kind: str, lo: float, hi: float, margin: float = 0.0) -> str:
    """``greater``/``less`` (the difference already signed): holds above 0, reversed below 0;
    ``at_least``: holds above -margin, reversed below -margin; else unresolved."""
    floor = -margin if kind == "at_least" else 0.0
    if lo > floor:
        return "holds"
    if hi < floor:
        return "reversed"
    return "unresolved"


def resolve(config: dict[str, Any], per_seed: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim over every seed of the config. A seed without a value on either side (not
    run, a run or metric missing, an empty table cell) makes the claim unresolved, with each
    such seed's reason: never a verdict on the other seeds."""
    seeds = list(config["seeds"])
    results = []
    for claim in config["claims"]:
        sides: dict[str, list[float]] = {"a": [], "b": []}
        missing = []
        for s in seeds:
            if s not in per_seed:
                missing.append(f"seed {s}: not run")
                sides["a"].append(math.nan)
                sides["b"].append(math.nan)
                continue
            why = []
            for side in ("a", "b"):
                try:
                    sides[side].append(value_of(per_seed[s], claim, side))
                except Missing as exc:
                    sides[side].append(math.nan)
                    why.append(str(exc))
            if why:
                missing.append(f"seed {s}: " + "; ".join(dict.fromkeys(why)))
        a, b = sides["a"], sides["b"]
        entry = {**{k: claim[k] for k in ("id", "text", "source", "kind", "margin_reason") if k in claim},
                 "margin": float(claim.get("margin", 0.0)), "a": a, "b": b, "seeds": seeds, "n": len(seeds),
                 "n_read": len(seeds) - len(missing), "missing": missing}
        if missing:
            entry.update(mean_a=math.nan, mean_b=math.nan, diff=math.nan, sd=math.nan, lo=math.nan, hi=math.nan,
                         verdict="unresolved", why="; ".join(missing))
        else:
            sign = -1.0 if claim["kind"] == "less" else 1.0
            mean, sd, lo, hi = interval([sign * (x - y) for x, y in zip(a, b)])
            entry.update(mean_a=sum(a) / len(a), mean_b=sum(b) / len(b), diff=mean, sd=sd, lo=lo, hi=hi,
                         verdict=verdict(claim["kind"], lo, hi, entry["margin"]))
            if all(x == y for x, y in zip(a, b)):  # e.g. a run whose every epoch lost to its start: its start's weights
                entry["why"] = ("a = b in every seed: both sides read the same value (the same weights), "
                                "so these runs cannot tell the two apart")
        results.append(entry)
    return results


def _f(x: float, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def claim_line(r: dict[str, Any]) -> str:
    """One claim's row. The seeds column is the config's seed count; an unresolved claim with a
    seed missing says which in its verdict cell."""
    op = OPERATORS[r["kind"]]
    margin = f" (margin {r['margin']:g})" if r["kind"] == "at_least" else ""
    reason = f": {'; '.join(r['missing'])}" if r.get("missing") else ""
    return (f"| {r['text']} | {r.get('source', '')} | {_f(r['mean_a'])} {op} {_f(r['mean_b'])}{margin} | "
            f"{_f(r['diff'])} | [{_f(r['lo'])}, {_f(r['hi'])}] | {r['n']} | **{r['verdict']}**{reason} |")


HEADER = ["| claim | paper | mean a vs b | paired diff | 95% CI | seeds | verdict |", "|---|---|---|---|---|---|---|"]


def at_once(meta: dict[str, Any]) -> str:
    jobs = meta.get("seed_jobs", 1)
    return f", {jobs} seeds at a time" if jobs > 1 else ""


def paper_markdown(config: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Paper {config['paper']}: {config['title']}", "",
             f"{meta['n_seeds']} seeds ({', '.join(map(str, meta['seeds']))}), fixed in the config before the run, "
             f"paired within a seed; {meta['test_images']} test images; {meta['seconds']} s on {meta['cores']} cores{at_once(meta)}; "
             f"commit {meta['commit']}, {meta['date']}. Config: `{meta['config']}`. {LEGEND}",
             *([f"**Not re-trained:** {meta['reread']['note']}"] if meta.get("reread") else []),
             *([f"Scores made at {', '.join(meta['made_at'])} (the same code as {meta['commit']})."]
               if meta.get("made_at") and not meta.get("other_code") and meta["made_at"] != [meta["commit"]] else []),
             *([f"**Scores made by other code:** {', '.join(meta['other_code'])} (of {', '.join(meta['made_at'])}): "
                "the seed folders held runs of earlier code, which the workflow does not re-train when only the "
                "code changes; re-run with a fresh `--workdir`."] if meta.get("other_code") else []),
             "", *HEADER, *map(claim_line, results), ""]
    for r in results:
        lines.append(f"* {r['text']}: a = {', '.join(_f(x) for x in r['a'])}; b = {', '.join(_f(x) for x in r['b'])}"
                     + (f" ({r['why']})" if r.get("why") and not r.get("missing") else "")
                     + (f" Margin: {r['margin_reason']}" if r.get("margin_reason") else ""))
    notes = config.get("notes", [])
    if notes:
        lines += ["", "Notes:", "", *[f"* {n}" for n in notes]]
    return "\n".join(lines) + "\n"
