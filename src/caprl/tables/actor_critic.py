"""Paper 003's Table 1 (Shi et al.: actor-critic with a visual-semantic embedding reward),
filled with this pipeline's runs: ``ac_table1``.

Rows are found from params.yaml by method and model, never by run name: for the model of every
``actor_critic`` run on the dataset (params order), the ``xe`` runs of that model, the
actor-critic runs with the evaluation's own decoding (beam search), the same runs' lookahead
captions (the ``lookahead`` section of their score files, ``evaluate.lookahead``) and the
``scst`` runs of that model. Columns: BLEU-3, BLEU-4, METEOR, CIDEr-D in %. A row with no run
shows as missing; several runs give several rows, each named. On ``coco`` the paper's rows
(its prior methods) are listed, and the paper's own result ("Ours": policy and value network,
i.e. lookahead) stands beside our lookahead row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from caprl.params import RunSpec
from caprl.tables import ac_numbers as paper
from caprl.tables.build import Scores, metric_cells, register_table, title, unavailable_notes, with_paper
from caprl.tables.render import Cell, Table
from caprl.tables.runs import select
from caprl.tables.settings import TableSettings

COLUMNS = [("B@3", "BLEU-3"), ("B@4", "BLEU-4"), ("M", "METEOR"), ("C", "CIDEr-D")]
AC_METHOD = "actor_critic"
Rows = list[tuple[str, list[Cell]]]


@dataclass(frozen=True)
class RowKind:
    method: str
    label: Callable[[TableSettings, RunSpec | None], str]  # (the table's settings, a run of the row) -> label
    section: Callable[[dict[str, Any] | None], dict[str, Any] | None]  # score file -> what metric_cells reads
    paper: dict[str, float] | None = None  # the paper's numbers beside this row (coco)


def _decoding(settings: TableSettings, spec: RunSpec | None) -> str:
    return settings.decoding(spec.decode if spec is not None else None)


def _lookahead(settings: TableSettings, spec: RunSpec | None) -> str:
    lam = f", λ = {settings.lookahead.lam:g}" if settings.lookahead else ""
    size = (spec.decode if spec is not None else settings.decode)["beam_size"]
    return f"Actor-critic (lookahead, beam {size}{lam})"


def _whole(report: dict[str, Any] | None) -> dict[str, Any] | None:
    return report


def _lookahead_section(report: dict[str, Any] | None) -> dict[str, Any] | None:
    return (report or {}).get("lookahead")


KINDS = [
    RowKind("xe", lambda settings, spec: "XE", _whole),
    RowKind(AC_METHOD, lambda settings, spec: f"Actor-critic ({_decoding(settings, spec)})", _whole),
    RowKind(AC_METHOD, _lookahead, _lookahead_section, paper.TABLE1_OURS),
    RowKind("scst", lambda settings, spec: "SCST", _whole),
]


def ac_models(params: dict[str, Any], dataset: str) -> list[str]:
    """The models of the dataset's actor-critic runs, in params order (each once)."""
    return list(dict.fromkeys(spec.model for spec in select(params, dataset, method=AC_METHOD)))


def kind_rows(params: dict[str, Any], settings: TableSettings, dataset: str, scores: Scores, model: str | None,
              kind: RowKind, suffix: str, coco: bool, notes: list[str]) -> Rows:
    """One row per run of the kind's method and ``model`` (a missing row if none)."""
    runs = select(params, dataset, method=kind.method, model=model) if model is not None else []
    keys = [key for _, key in COLUMNS]
    rows: Rows = []
    for spec in runs or [None]:
        report = scores.get(spec.name) if spec is not None else None
        section = kind.section(report)
        if report is not None and section is None:
            notes.append(f"{spec.name}: its score file has no lookahead section (set evaluate.lookahead and "
                         "re-run its evaluation).")
        cells = metric_cells(section, COLUMNS)
        if coco and kind.paper is not None:
            cells = [Cell(c.ours, kind.paper.get(k), flags=c.flags) for c, k in zip(cells, keys)]
        label = kind.label(settings, spec) + suffix + (f" [{spec.name}]" if spec is not None and len(runs) > 1 else "")
        rows.append((label, cells))
    return rows


def shown_scores(params: dict[str, Any], settings: TableSettings, dataset: str, scores: Scores,
                 models: list[str]) -> Scores:
    """The score files (and lookahead sections) the table reads, for the notes on unavailable metrics."""
    shown: Scores = {}
    for model in models:
        for kind in KINDS:
            for spec in select(params, dataset, method=kind.method, model=model):
                section = kind.section(scores.get(spec.name))
                if section is not None:
                    shown[f"{spec.name}/{kind.label(settings, spec)}"] = section
    return shown


@register_table("ac_table1")
def ac_table1(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Paper 003 Table 1: XE, actor-critic (beam and lookahead) and SCST of the actor-critic
    runs' models; the paper's rows beside ours on coco."""
    shorts = [short for short, _ in COLUMNS]
    settings = TableSettings.from_params(params)
    table = Table("ac_table1", title(settings, dataset, f"{paper.PAPER} Table 1, actor-critic with embedding reward"),
                  shorts)
    coco = with_paper(dataset)
    if coco:
        table.rows += [(f"{label} [paper]", [Cell(None, row.get(key)) for _, key in COLUMNS])
                       for label, row in paper.TABLE1_PRIOR]
    models = ac_models(params, dataset)
    notes: list[str] = []
    for model in models or [None]:
        suffix = f" [{model}]" if len(models) > 1 else ""
        for kind in KINDS:
            table.rows += kind_rows(params, settings, dataset, scores, model, kind, suffix, coco, notes)
    table.notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing run or metric. "
                   "Rows by method (xe, actor_critic, scst) of the actor-critic runs' model; lookahead: "
                   "the actor-critic run's lookahead captions (evaluate.lookahead)."]
    if coco:
        table.notes.append(f"(paper x, ±d): {paper.PAPER} Table 1, MS COCO Karpathy test; the paper's result "
                           "(its policy and value networks) beside our lookahead row, and our difference; [paper] "
                           "rows are the paper's prior methods (— = unknown in the paper). The paper's CIDEr is "
                           "coco-caption's CIDEr-D.")
    else:
        table.notes.append(f"No paper numbers on {dataset}: {paper.PAPER}'s Table 1 is on MS COCO (shown for the "
                           "dataset coco).")
    if not models:
        table.notes.append(f"No actor_critic run trains on {dataset}.")
    table.notes += unavailable_notes(shown_scores(params, settings, dataset, scores, models)) + notes
    return table
