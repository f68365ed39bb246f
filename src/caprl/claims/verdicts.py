"""How a claim is decided and printed (:mod:`caprl.claims`): each seed's value of a claim's
two sides (a score file's metric or a table cell), the paired differences' mean and 95% Student-t
interval over every seed of the config, the verdict, the paired t-test's p-value and its
Holm-Bonferroni adjustment over the paper's claims (:func:`holm`), the paper's page and the summary
of every paper. No workflow, no git."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

PERCENT = ("metrics.", "lookahead.metrics.", "diversity.rs.CIDEr-D", "diversity.bs.CIDEr-D")
KINDS = ("greater", "less", "at_least")
OPERATORS = {"greater": ">", "less": "<", "at_least": "≥"}
VERDICTS = ("holds", "reversed", "unresolved")
ALPHA = 0.05  # the interval is 1 - ALPHA; Holm's family-wise error rate
LEGEND = ("The difference d is a - b (b - a for '<'), per seed; its mean and 95% Student-t interval are over "
          "every seed of the config (the seeds column). Verdict: '>' and '<' claims **hold** if the interval "
          "lies above 0 and are **reversed** if it lies below 0; a '≥' claim (margin m: the paper says "
          "\"comparable\") **holds** if the interval lies above -m (a not worse than b by m or more) and is "
          "**reversed** if it lies below -m; else **unresolved**. A seed without a value on either side (a "
          "missing run or metric, an empty table cell: a curve not reaching the operating point) makes the "
          "claim unresolved, the seed named: never a verdict on the other seeds.")


def holm_legend(m: int) -> str:
    return (f"**Holm:** the family is this paper's {m} claims, every one fixed in its config before the run. "
            "Each claim's p is the two-sided paired t-test whose 95% interval gives its verdict (d against 0; "
            "against -m for a '≥' claim), so p < 0.05 exactly where that interval excludes the null value; "
            "Holm-Bonferroni (statsmodels `multipletests`, method `holm`) adjusts the family's p-values so that "
            "the chance of any wrong verdict among its claims is at most 5%. Holm verdict: **holds** (or "
            "**reversed**, by the sign of the difference from the null value) where the adjusted p is below "
            "0.05, else **unresolved**. A claim unresolved for a seed without a value is not tested (p —) "
            "and enters the family with p = 1: it counts in the family's size, so a claim that could not be "
            "read does not relax the correction of the others, and it is never rejected.")


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
    floor = null_value(kind, margin)
    if lo > floor:
        return "holds"
    if hi < floor:
        return "reversed"
    return "unresolved"


def resolve(config: dict[str, Any], per_seed: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim over every seed of the config. A seed without a value on either side (not
    run, a run or metric missing, an empty table cell) makes the claim unresolved, with each
    such seed's reason: never a verdict on the other seeds. Then :func:`holm` over them: the family
    is the config's claims."""
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
        entry = {**{k: claim[k] for k in ("id", "text", "source", "kind", "margin_reason") if k in claim},
                 "margin": float(claim.get("margin", 0.0)), "a": sides["a"], "b": sides["b"], "seeds": seeds,
                 "n": len(seeds), "n_read": len(seeds) - len(missing), "missing": missing}
        results.append(decide(entry))
    return holm(results)


def null_value(kind: str, margin: float = 0.0) -> float:
    """What the signed difference is tested against: 0, or -margin for an ``at_least`` claim."""
    return -margin if kind == "at_least" else 0.0


def p_value(diffs: list[float], null: float) -> float:
    """Two-sided paired (one-sample) t-test of the differences against ``null``: the test that
    :func:`interval` inverts, so p < ALPHA exactly where the 95% interval excludes ``null``.
    Differences all equal (sd 0): 0 where they differ from ``null``, else 1."""
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return 1.0
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0.0:
        return 1.0 if mean == null else 0.0
    t = (mean - null) / (sd / math.sqrt(n))
    return float(2.0 * stats.t.sf(abs(t), n - 1))


def decide(entry: dict[str, Any]) -> dict[str, Any]:
    """A claim's statistics from its per-seed sides (``a``, ``b``, ``missing``, ``kind``, ``margin``):
    the mean, sd and 95% interval of the paired differences, the verdict and the t-test's p. A seed
    missing leaves no interval and no p (``nan``): unresolved. Also re-decides a stored entry
    (``claims.py --render-only``): what it computed before is replaced."""
    entry = {k: v for k, v in entry.items() if k not in ("mean_a", "mean_b", "diff", "sd", "lo", "hi", "verdict",
                                                          "why", "p", "p_holm", "holm", "holm_m")}
    a, b, missing = entry["a"], entry["b"], entry["missing"]
    if missing:
        entry.update(mean_a=math.nan, mean_b=math.nan, diff=math.nan, sd=math.nan, lo=math.nan, hi=math.nan,
                     verdict="unresolved", why="; ".join(missing), p=math.nan)
        return entry
    sign = -1.0 if entry["kind"] == "less" else 1.0
    diffs = [sign * (x - y) for x, y in zip(a, b)]
    mean, sd, lo, hi = interval(diffs)
    entry.update(mean_a=sum(a) / len(a), mean_b=sum(b) / len(b), diff=mean, sd=sd, lo=lo, hi=hi,
                 verdict=verdict(entry["kind"], lo, hi, entry["margin"]),
                 p=p_value(diffs, null_value(entry["kind"], entry["margin"])))
    if all(x == y for x, y in zip(a, b)):  # e.g. a run whose every epoch lost to its start: its start's weights
        if len(set(a)) > 1:
            same = "a = b in every seed: both sides read the same value (the same weights)"
        else:  # or a rate neither run leaves
            same = (f"a = b = {a[0]:g} in every seed: the metric does not move on either side (the same "
                    "weights, or a rate neither run leaves, e.g. no caption ending badly)")
        entry["why"] = f"{same}, so these runs cannot tell the two apart"
    return entry


def holm(results: list[dict[str, Any]], alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Holm-Bonferroni over the family ``results`` (one paper's claims): each entry gets ``p_holm``
    (its adjusted p), ``holm`` (its verdict: holds or reversed, by the sign of the difference from
    the null value, where ``p_holm`` < alpha; else unresolved) and ``holm_m`` (the family's size).
    A claim without a p (a seed without a value) is not tested: it enters with p = 1, so it counts
    in the family's size and is never rejected; its ``p_holm`` is ``nan`` (printed —)."""
    from statsmodels.stats.multitest import multipletests

    if not results:
        return results
    raw = [1.0 if math.isnan(r["p"]) else r["p"] for r in results]
    _, adjusted, _, _ = multipletests(raw, alpha=alpha, method="holm")
    out = []
    for r, p in zip(results, adjusted):
        r = dict(r)
        tested = not math.isnan(r["p"])
        r["p_holm"] = float(p) if tested else math.nan
        r["holm_m"] = len(results)
        if tested and p < alpha:
            r["holm"] = "holds" if r["diff"] > null_value(r["kind"], r["margin"]) else "reversed"
        else:
            r["holm"] = "unresolved"
        out.append(r)
    return out


def counts(results: list[dict[str, Any]], key: str) -> dict[str, int]:
    """How many claims hold, are reversed, are unresolved by ``key`` (``verdict`` or ``holm``)."""
    return {v: sum(r[key] == v for r in results) for v in VERDICTS}


def _f(x: float, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x: float) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def claim_line(r: dict[str, Any]) -> str:
    """One claim's row. The seeds column is the config's seed count; an unresolved claim with a
    seed missing says which in its verdict cell. Then its p, its Holm-adjusted p and Holm verdict."""
    op = OPERATORS[r["kind"]]
    margin = f" (margin {r['margin']:g})" if r["kind"] == "at_least" else ""
    reason = f": {'; '.join(r['missing'])}" if r.get("missing") else ""
    return (f"| {r['text']} | {r.get('source', '')} | {_f(r['mean_a'])} {op} {_f(r['mean_b'])}{margin} | "
            f"{_f(r['diff'])} | [{_f(r['lo'])}, {_f(r['hi'])}] | {r['n']} | **{r['verdict']}**{reason} | "
            f"{_p(r['p'])} | {_p(r['p_holm'])} | **{r['holm']}** |")


COLUMNS = "mean a vs b | paired diff | 95% CI | seeds | verdict (95% CI) | p | Holm p | Holm verdict |"
HEADER = [f"| claim | paper | {COLUMNS}", "|---|---|---|---|---|---|---|---|---|---|"]


def built(meta: dict[str, Any]) -> str:
    """How the scores were built: by the workflow's claims target (``dag``: its target, the seeds'
    training seconds summed), or, before claims were DAG targets, by benchmarks/claims.py (wall seconds)."""
    if "dag" in meta:
        return f"built by `snakemake {meta['dag']['target']}`, {meta['dag']['train_seconds']} s of training over the seeds"
    jobs = meta.get("seed_jobs", 1)
    return f"{meta['seconds']} s on {meta['cores']} cores" + (f", {jobs} seeds at a time" if jobs > 1 else "")


def tally(c: dict[str, int]) -> str:
    return f"{c['holds']} hold, {c['reversed']} reversed, {c['unresolved']} unresolved"


def paper_markdown(config: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Paper {config['paper']}: {config['title']}", "",
             f"{meta['n_seeds']} seeds ({', '.join(map(str, meta['seeds']))}), fixed in the config before the run, "
             f"paired within a seed; {meta['test_images']} test images; {built(meta)}; "
             f"commit {meta['commit']}, {meta['date']}. Config: `{meta['config']}`. {LEGEND}",
             "", f"Its tables over the seeds (each cell's mean and 95% interval): `results/claims/{config['paper']}_tables.md`.",
             *(["", holm_legend(len(results))] if results else []),
             *([f"**Not re-trained:** {meta['reread']['note']}"] if meta.get("reread") else []),
             *(["", f"**Verdicts rendered** at {meta['rendered']['commit']} ({meta['rendered']['date']}) from the "
                "per-seed values this run stored: no run re-trained, no score re-read."] if meta.get("rendered") else []),
             *([f"Scores made at {', '.join(meta['made_at'])} (the same code as {meta['commit']})."]
               if meta.get("made_at") and not meta.get("other_code") and meta["made_at"] != [meta["commit"]] else []),
             *([f"**Scores made by other code:** {', '.join(meta['other_code'])} (of {', '.join(meta['made_at'])}): "
                "the seed folders held runs of earlier code, which the workflow does not re-train when only the "
                f"code changes; remove claims/{config['paper']}/ and build claims_{config['paper']} again."] if meta.get("other_code") else []),
             "", *HEADER, *map(claim_line, results), ""]
    if results:
        lines += [f"Of the {len(results)} claims: by their 95% intervals {tally(counts(results, 'verdict'))}; "
                  f"after Holm over the {len(results)}: {tally(counts(results, 'holm'))}.", ""]
    for r in results:
        lines.append(f"* {r['text']}: a = {', '.join(_f(x) for x in r['a'])}; b = {', '.join(_f(x) for x in r['b'])}"
                     + (f" ({r['why']})" if r.get("why") and not r.get("missing") else "")
                     + (f" Margin: {r['margin_reason']}" if r.get("margin_reason") else ""))
    outside = config.get("outside", [])
    if outside:
        lines += ["", f"Outside these params ({len(outside)}; no verdict, not in Holm's family):", "",
                  *[f"* {o['text']}: {o['why']}" for o in outside]]
    notes = config.get("notes", [])
    if notes:
        lines += ["", "Notes:", "", *[f"* {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def summary_markdown(out_dir: Path) -> str:
    """Every paper's claims found in ``out_dir`` (``<paper>.json``), then how many hold, are reversed
    and are unresolved per paper and in total, by the per-claim 95% interval and after Holm (each
    paper's claims its own family)."""
    lines = [f"| paper | claim | {COLUMNS}", "|---|---|---|---|---|---|---|---|---|---|"]
    stamps = []
    tallies = []
    for path in sorted(out_dir.glob("[0-9][0-9][0-9].json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        reread, rendered = meta.get("reread"), meta.get("rendered")
        stamps.append(f"{data['paper']}: {meta['commit']}, {meta['date']}"
                      + (f" (verdicts re-read at {reread['commit']} from those scores)" if reread else "")
                      + (f" (verdicts rendered at {rendered['commit']} from its stored values)" if rendered else "")
                      + (f" (**scores made by other code: {', '.join(meta['other_code'])}**)"
                         if meta.get("other_code") else ""))
        for r in data["results"]:
            cells = claim_line(r).split(" | ")
            lines.append(f"| {data['paper']} | {cells[0].lstrip('| ')} | " + " | ".join(cells[2:]))
        tallies.append((data["paper"], len(data["results"]), counts(data["results"], "verdict"),
                        counts(data["results"], "holm")))
    total = ("total", sum(t[1] for t in tallies), *({v: sum(t[i][v] for t in tallies) for v in VERDICTS}
                                                      for i in (2, 3)))
    lines += ["", "Verdicts per paper (holds / reversed / unresolved); Holm: each paper's claims are one family.", "",
              "| paper | claims | 95% CI per claim | Holm over the paper's claims |", "|---|---|---|---|"]
    for paper, m, per_claim, by_holm in [*tallies, total]:
        bold = "**" if paper == "total" else ""
        lines.append(f"| {bold}{paper}{bold} | {m} | " + " | ".join(
            f"{c['holds']} / {c['reversed']} / {c['unresolved']}" for c in (per_claim, by_holm)) + " |")
    from caprl.claims.aggregate import across_markdown, across_papers

    papers = {path.stem: json.loads(path.read_text()) for path in sorted(out_dir.glob("[0-9][0-9][0-9].json"))}
    lines.append(across_markdown(across_papers(papers)))
    return "\n".join(lines) + "\n\nMeasured: " + "; ".join(stamps) + ".\n"
