"""The Stack-Captioning paper's Tables 1-3, filled with this pipeline's runs.

Rows are found from params.yaml, not from run names: a Table 1 row is every ``xe`` run on
the dataset of the row's model (a key of params.yaml ``models:``; the paper's "LSTM" is
``fc_lstm``, Vinyals et al.'s cell with the image as first input, not Rennie et al.'s maxout
``fc``); a Table 2 row every run of the row's model and method (``scst`` for the one-stage
models, ``c2f`` for Stack-Cap). A row with
no run shows as missing; several runs give several rows, each named. When the dataset is
``coco`` every cell carries the paper's number (Tables 1-3 of
:mod:`caprl.tables.paper_numbers`) and Table 3 lists the paper's prior methods.

The Markdown notes link the attention figure (Fig. 3) when its PNGs exist: the figure
stage writes them to ``results/figures/<dataset>/attention/attention_<k>.png`` and the
tables to ``results/tables/`` (both relative to the repository root, as in the DAG).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caprl.tables import paper_numbers as paper
from caprl.tables.build import METRICS, Scores, metric_cells, register_table, title, unavailable_notes, with_paper
from caprl.tables.render import Cell, Table
from caprl.tables.runs import select
from caprl.tables.settings import TableSettings

ATTENTION_FIGURES = "results/figures/{dataset}/attention"
TABLES_DIR = "results/tables"
COLUMNS_12 = ["B@1", "B@2", "B@3", "B@4", "M", "C"]
COLUMNS_3 = ["B@1", "B@2", "B@3", "B@4", "M", "R", "C", "S"]


@dataclass(frozen=True)
class RowSpec:
    label: str
    model: str  # a key of params.yaml models: (paper_numbers' rows are keyed by it)
    method: str  # the runs' objective (registry key)
    paper: dict[str, float]


TABLE1_ROWS = [
    RowSpec("LSTM (XE)", "fc_lstm", "xe", paper.TABLE1["fc_lstm"]),
    RowSpec("LSTM3 layers (XE)", "lstm3", "xe", paper.TABLE1["lstm3"]),
    RowSpec("LSTM+Att_Soft (XE)", "softatt", "xe", paper.TABLE1["softatt"]),
    RowSpec("LSTM+Att_Top-Down (XE)", "topdown", "xe", paper.TABLE1["topdown"]),
    RowSpec("Stack-Cap* (XE)", "stackcap_star", "xe", paper.TABLE1["stackcap_star"]),
    RowSpec("Stack-Cap (XE)", "stackcap", "xe", paper.TABLE1["stackcap"]),
]
TABLE2_ROWS = [
    RowSpec("LSTM (SCST, CIDEr)", "fc_lstm", "scst", paper.TABLE2["fc_lstm"]),
    RowSpec("LSTM3 layers (SCST, CIDEr)", "lstm3", "scst", paper.TABLE2["lstm3"]),
    RowSpec("LSTM+Att_Soft (SCST, CIDEr)", "softatt", "scst", paper.TABLE2["softatt"]),
    RowSpec("LSTM+Att_Top-Down (SCST, CIDEr)", "topdown", "scst", paper.TABLE2["topdown"]),
    RowSpec("Stack-Cap* (C2F)", "stackcap_star", "c2f", paper.TABLE2["stackcap_star"]),
    RowSpec("Stack-Cap (C2F)", "stackcap", "c2f", paper.TABLE2["stackcap"]),
]
TABLE3_OURS = RowSpec("Stack-Cap (C2F), ours", "stackcap", "c2f", paper.TABLE3_STACKCAP)


def matching_runs(params: dict[str, Any], dataset: str, model: str, method: str) -> list[str]:
    """The dataset's runs (in params order) of ``method`` and ``model``."""
    return [view.name for view in select(params, dataset, method=method, model=model)]


def _metrics(columns: list[str]) -> list[tuple[str, str]]:
    keys = dict(METRICS)
    return [(c, keys[c]) for c in columns]


def model_rows(params: dict[str, Any], dataset: str, scores: Scores, spec: RowSpec,
               columns: list[str]) -> list[tuple[str, list[Cell]]]:
    """One row per matching run (a missing row if none); paper numbers on COCO."""
    runs = matching_runs(params, dataset, spec.model, spec.method)
    rows = []
    for run in runs or [None]:
        cells = metric_cells(scores.get(run) if run else None, _metrics(columns))
        if with_paper(dataset):
            cells = [Cell(c.ours, spec.paper.get(col), c.spread, flags=c.flags) for c, col in zip(cells, columns)]
        label = spec.label if len(runs) <= 1 else f"{spec.label} [{run}]"
        rows.append((label, cells))
    return rows


def figure_note(figures_dir: Path, tables_dir: Path) -> list[str]:
    """A Markdown line linking the attention-figure PNGs (relative to the tables), if any exist."""
    def index(p: Path) -> int:
        found = re.search(r"(\d+)$", p.stem)
        return int(found.group(1)) if found else -1

    pngs = sorted(figures_dir.glob("attention_*.png"), key=index)
    if not pngs:
        return []
    links = " ".join(f"![attention maps {index(p)}]({Path(os.path.relpath(p, tables_dir)).as_posix()})" for p in pngs)
    return ["", "Attention maps of every stage, per generated word (cf. Stack-Cap Fig. 3):", "", links]


def _notes(dataset: str, scores: Scores, table: int) -> list[str]:
    notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing run or metric."]
    if with_paper(dataset):
        notes.append(f"(paper x, ±d): Stack-Cap (Gu et al. 2018) Table {table}, MSCOCO Karpathy test, "
                     "and our difference.")
    notes += unavailable_notes(scores)
    figures = Path(ATTENTION_FIGURES.format(dataset=dataset))
    return notes + figure_note(figures, Path(TABLES_DIR))


def _used(params: dict[str, Any], dataset: str, scores: Scores, specs: list[RowSpec]) -> Scores:
    """The score files of the runs a table shows (for the notes on unavailable metrics)."""
    runs = {run for s in specs for run in matching_runs(params, dataset, s.model, s.method)}
    return {run: s for run, s in scores.items() if run in runs}


def _model_table(name: str, what: str, specs: list[RowSpec], number: int, params: dict[str, Any],
                 dataset: str, scores: Scores) -> Table:
    table = Table(name, title(TableSettings.from_params(params), dataset, what), list(COLUMNS_12))
    for spec in specs:
        table.rows += model_rows(params, dataset, scores, spec, COLUMNS_12)
    table.notes = _notes(dataset, _used(params, dataset, scores, specs), number)
    return table


@register_table("stackcap_table1")
def stackcap_table1(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Stack-Cap Table 1: every model after cross-entropy training."""
    return _model_table("stackcap_table1", "Stack-Cap Table 1, cross-entropy (XE)", TABLE1_ROWS, 1,
                        params, dataset, scores)


@register_table("stackcap_table2")
def stackcap_table2(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Stack-Cap Table 2: one-stage models after SCST, Stack-Cap models after C2F."""
    return _model_table("stackcap_table2", "Stack-Cap Table 2, after RL (SCST / C2F)", TABLE2_ROWS, 2,
                        params, dataset, scores)


@register_table("stackcap_table3")
def stackcap_table3(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Stack-Cap Table 3: our Stack-Cap (C2F) beside the paper's prior methods (COCO only)."""
    table = Table("stackcap_table3", title(TableSettings.from_params(params), dataset, "Stack-Cap Table 3, comparison with prior methods"),
                  list(COLUMNS_3))
    coco = with_paper(dataset)
    if coco:
        for label, row in paper.TABLE3_PRIOR:
            table.rows.append((f"{label} [paper]", [Cell(None, row.get(c)) for c in COLUMNS_3]))
    table.rows += model_rows(params, dataset, scores, TABLE3_OURS, COLUMNS_3)
    table.notes = _notes(dataset, _used(params, dataset, scores, [TABLE3_OURS]), 3)
    if not coco:
        table.notes.insert(1, "The paper's rows for prior methods are MSCOCO numbers: they are listed only "
                              "for the dataset coco.")
    return table
