"""The papers' tables over the claims' seeds: one seed is not a number to print (the same commit and
seed gave fc-xe 166.4 test CIDEr-D on an AMD EPYC and 179.1 on an Intel Xeon: float kernels differ
between CPUs, and a single run inherits that noise).

Each seed's table is the pipeline's own (:func:`caprl.claims.collect.seed_tables`, from that seed's
score files); here, cell by cell, the mean over the seeds and its 95% Student-t interval, the seed
count in the caption. A cell equal in every seed (a paper's published number) is printed as it is;
an empty cell in some seed leaves the mean of the others, said with its n; a table whose text cells
differ by seed (captions: ``sle_samples``) is not averaged, said so.
"""

from __future__ import annotations

import csv
import io as text_io
import math
from typing import Any

from caprl.claims.verdicts import t_quantile


def number(cell: str) -> float | None:
    """The cell's number; None for an empty cell (— or blank); ValueError for text."""
    cell = cell.strip()
    return None if cell in ("", "—") else float(cell)


def mean_cell(values: list[str], n_seeds: int) -> str:
    """``mean ± h`` (h: the 95% half-width over the seeds with a value; ``(n=k)`` where k < n_seeds),
    the value where every seed has the same, ``—`` where none has one."""
    numbers = [x for x in map(number, values) if x is not None]
    if not numbers:
        return "—"
    if len(set(values)) == 1:
        return values[0]
    k = len(numbers)
    mean = math.fsum(numbers) / k
    short = f" (n={k})" if k < n_seeds else ""
    if k < 2:
        return f"{mean:.2f}{short}"
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in numbers) / (k - 1))
    return f"{mean:.2f} ± {t_quantile(k - 1) * sd / math.sqrt(k):.2f}{short}"


def over_seeds(csvs: list[str]) -> list[list[str]] | str:
    """The seeds' CSV texts of one table, cell by cell (rows matched by their first cell, columns by
    name, in the first seed's order); the reason where they cannot be averaged."""
    tables = [list(csv.reader(text_io.StringIO(text))) for text in csvs]
    header = tables[0][0]
    if any(t[0] != header for t in tables):
        return "its columns differ by seed"
    rows = {tuple(r[:1]) for t in tables for r in t[1:]}
    order = [r[0] for r in tables[0][1:]] + sorted(r[0] for r in rows if r[0] not in {x[0] for x in tables[0][1:]})
    by_seed = [{r[0]: r for r in t[1:]} for t in tables]
    out = [header]
    for name in order:
        line = [name]
        for col in range(1, len(header)):
            values = [seed[name][col] if name in seed else "" for seed in by_seed]
            try:
                line.append(mean_cell(values, len(tables)))
            except ValueError:
                if len(set(values)) > 1:
                    return f"its text cells differ by seed (column {header[col]!r}: captions)"
                line.append(values[0])
        out.append(line)
    return out


def tables_markdown(per_seed: dict[Any, dict[str, Any]], seeds: list[int]) -> str:
    """Every table the seeds built (``tables`` of each seed's values, its title first in
    ``table_notes``), averaged over the seeds, one section each."""
    per_seed = {int(seed): values for seed, values in per_seed.items()}  # a stored json's keys are strings
    keys = sorted({key for values in per_seed.values() for key in values.get("tables", {})})
    lines = []
    for key in keys:
        have = [s for s in seeds if key in per_seed.get(s, {}).get("tables", {})]
        title = per_seed[have[0]].get("table_notes", {}).get(key, [key])[0]
        rows = over_seeds([per_seed[s]["tables"][key] for s in have])
        lines += [f"## {key}", "", f"{title}. Mean ± 95% interval (Student t) over {len(have)} seeds "
                  f"({', '.join(map(str, have))}); a cell equal in every seed as it is; (n=k): k seeds had a value.", ""]
        if isinstance(rows, str):
            lines += [f"Not averaged: {rows}.", ""]
            continue
        lines += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0]),
                  *("| " + " | ".join(r) + " |" for r in rows[1:]), ""]
    return "\n".join(lines)
