"""What paper 004's tables (:mod:`caprl.tables.psst`) share: the family of runs on a dataset
(:class:`Family`), the cells read off its curves at an operating point, and the notes that say why a
cell is empty, how the point was chosen and what the listeners' gold captions recall."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from caprl.tables import psst_numbers as paper
from caprl.tables.build import Scores, degenerate_flags, unavailable_notes
from caprl.tables.operating import (FROZEN, FROZEN_LABELS, METHOD_LABELS, PSST_METHODS, RECALLS, TEST, VAL, Curve,
                                    OperatingPoint, Point, curve, decode_text, family_points, interpolate,
                                    method_points, models_of, on_validation, overlap_value, read_curve, table_rho,
                                    x_range)
from caprl.tables.render import Cell
from caprl.tables.runs import gold_retrieval_runs
from caprl.tables.settings import TableSettings

Rows = list[tuple[str, list[Cell]]]


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def fraction(value: float) -> str:
    return f"{value:.3f}"


def exact_cell(value: float | None) -> Cell:
    """A λ or ρ with as many decimals as it has (0.0005, 0.25)."""
    if value is None:
        return Cell(None)
    digits = f"{value:.10f}".rstrip("0").split(".")[1]
    return Cell(value, decimals=max(1, len(digits)))


def frozen_label(point: Point) -> str:
    init = point.init_method or "?"
    return FROZEN_LABELS.get(init, f"Frozen Speaker ({METHOD_LABELS.get(init, init)})")


def frozen_kind(point: Point) -> str:
    """Key of a frozen-speaker run's row in the paper's Table 3: ``frozen_speaker:<init method>``."""
    return f"{FROZEN}:{point.init_method}"


class Family:
    """The family's points on one dataset and what the tables need of them."""

    def __init__(self, params: dict[str, Any], dataset: str, scores: Scores) -> None:
        self.params, self.dataset, self.scores = params, dataset, scores
        self.settings = TableSettings.from_params(params)
        self.points = family_points(params, dataset, scores)
        self.rho = table_rho(params)
        self.models: list[str | None] = list(models_of(params, self.points)) or [None]
        self.split = VAL if on_validation(self.points) else TEST  # the curves an auto operating point is chosen on

    def runs(self, method: str, model: str | None) -> list[Point]:
        """The method's runs of the model in λ order (PSST: those of ρ = table_rho)."""
        return method_points(self.points, method, self.rho if method in PSST_METHODS else None, model)

    def label(self, label: str, model: str | None) -> str:
        return label if len(self.models) <= 1 or model is None else f"{label} [{model}]"

    def curves(self, methods: list[str], x: str, y: str, split: str = TEST) -> list[Curve]:
        return [curve(self.runs(m, model), x, y, split) for model in self.models for m in methods]

    def auto(self, methods: list[str], x: str, y: str) -> float | None:
        """The overlap value of the methods' curves in ``x``: their validation curves where the runs
        carry validation numbers (each test number is then read where its validation curve reaches
        the point), else their test curves."""
        return overlap_value(self.curves(methods, x, y, self.split))

    def title(self, what: str) -> str:
        return f"{self.dataset} {self.settings.split} split: {paper.PAPER} {what} ({decode_text(self.points)})"

    def flags(self, points: list[Point]) -> tuple[str, ...]:
        """The degenerate-caption footnotes of the points' runs (a curve through them is suspect)."""
        return tuple(flag for p in points for flag in degenerate_flags(self.scores.get(p.spec.name)))

    def shown_scores(self) -> Scores:
        runs = {p.spec.name for p in self.points}
        return {run: s for run, s in self.scores.items() if run in runs}

    def missing_note(self, method: str, model: str | None, label: str) -> str | None:
        """Which runs of the method lack scores or retrieval results (None: all have them)."""
        runs = self.runs(method, model)
        lacking = [p.spec.name for p in runs if not p.complete]
        if not runs:
            rho = f" with ρ = {self.rho:g}" if method in PSST_METHODS else ""
            return f"{label}: no {method} run{rho} trains on {self.dataset}."
        if lacking:
            return (f"{label}: {len(lacking)} of {len(runs)} runs lack scores or retrieval results "
                    f"({', '.join(lacking)}).")
        return None


def gold_reports(params: dict[str, Any], dataset: str, scores: Scores) -> dict[str, dict[str, Any] | None]:
    """Listener pre-training run on ``dataset`` -> its gold-caption retrieval report (None: missing)."""
    return {spec.name: (scores.get(spec.name) or {}).get("retrieval") for spec in gold_retrieval_runs(params, dataset)}


def gold_notes(params: dict[str, Any], dataset: str, scores: Scores) -> list[str]:
    """One note per listener pre-training run: its recall by the first gold captions of the split."""
    split = TableSettings.from_params(params).split
    notes = []
    for run, report in gold_reports(params, dataset, scores).items():
        if report is None:
            notes.append(f"Listener {run}: no recall of the first gold captions of the {split} images (its "
                         "retrieval.json, `caprl retrieval --gold`, is missing).")
            continue
        recalls = ", ".join(f"{k} {percent(report[k])}" for k in RECALLS if k in report)
        notes.append(f"Listener {run}, the first gold caption of each of the {report.get('n_images', '?')} "
                     f"{report.get('split', split)} images: {recalls} (an upper reference for the captions' recall).")
    return notes


def outside_note(label: str, points: list[Point], x: str, op: OperatingPoint,
                 show: Callable[[float], str]) -> str | None:
    """Why a curve has no value at the operating point: the range of ``x`` its runs cover (the
    numbers the point was chosen on: the x of the curve the cells are read on)."""
    span = x_range(read_curve(points, x, x, op.split))  # the points having x (and a test number)
    if op.value is None or span is None or span[0] <= op.value <= span[1]:
        return None
    val = "val " if op.split == VAL else ""
    return f"{label}: its runs' {val}{x} spans {show(span[0])}–{show(span[1])}, not {show(op.value)}."


def operating_note(op: OperatingPoint, x: str) -> list[str]:
    """How an auto operating point was chosen: on the validation curves (read on test), or, without
    the runs' validation numbers, on the test curves."""
    if not op.auto:
        return []
    if op.split == VAL:
        return [f"Operating point chosen on the validation split: the highest {x} the most compared validation "
                "curves reach (each run's point: the val numbers of the epoch its evaluated checkpoint holds: val "
                "CIDEr-D of its evaluation decoding, val recall of its greedy captions among the val images); each "
                "method's test numbers are read where its validation curve reaches it (the two runs whose val values "
                "bracket it, their test numbers mixed in the same proportion); — where its validation curve does not "
                "reach it."]
    return ["Operating point chosen on the test curves, not on validation: the score files carry no validation "
            "numbers (caprl evaluate writes them, from the evaluated checkpoint: caprl.evaluation.validation)."]


def unvalidated_note(label: str, points: list[Point], op: OperatingPoint) -> str | None:
    """Which of a curve's runs have test numbers but no validation numbers (no scored epoch, or a score
    file without them) where the point was chosen on validation: they are not on its validation curve."""
    if op.split != VAL:
        return None
    lacking = [p.spec.name for p in points if p.complete and not p.val]
    one = len(lacking) == 1
    return (f"{label}: {', '.join(lacking)} {'has' if one else 'have'} no validation numbers in "
            f"{'its score file' if one else 'their score files'}: left out of its validation curve."
            if lacking else None)


def read_cells(points: list[Point], x: str, ys: list[str], op: OperatingPoint, scale: float, decimals: int,
               numbers: dict[str, float] | None) -> list[Cell]:
    """Each test ``y`` read at the operating point on the (x, y) curve of ``points`` (x of the
    numbers it was chosen on: :func:`read_curve`), times ``scale``; paper's beside."""
    cells = []
    for y in ys:
        value = None if op.value is None else interpolate(read_curve(points, x, y, op.split), op.value)
        cells.append(Cell(None if value is None else scale * value, (numbers or {}).get(y), decimals=decimals))
    return cells


def curve_rows(family: Family, methods: list[str], x: str, ys: list[str], op: OperatingPoint, scale: float,
               decimals: int, numbers: dict[str, dict[str, float]] | None, show: Callable[[float], str],
               notes: list[str]) -> Rows:
    rows = []
    for model in family.models:
        for method in methods:
            label = family.label(METHOD_LABELS[method], model)
            runs = [p for p in family.runs(method, model) if p.complete]
            flags = family.flags(runs)
            rows.append((label, [dataclasses.replace(c, flags=flags) for c in read_cells(
                runs, x, ys, op, scale, decimals, None if numbers is None else numbers.get(method))]))
            notes += [n for n in (family.missing_note(method, model, label), outside_note(label, runs, x, op, show),
                                  unvalidated_note(label, runs, op)) if n]
    return rows


def common_notes(family: Family, what: str, home: str, number: int, here: bool, language: bool) -> list[str]:
    """The notes every curve table has (``language``: it shows language metrics, so say which were not
    computed)."""
    notes = [f"Each method's runs (several λ) form a curve, read by linear interpolation at {what}; — = no run "
             "with scores and retrieval results, or a curve not reaching the operating point (every run's numbers: "
             "table psst_points).",
             f"PSST rows: runs with ρ = {family.rho:g} (discriminative.table_rho). Recall: the run's own listener "
             "ranking every image of the split by cosine similarity to the caption."]
    if here:
        notes.append(f"(paper x, ±d): {paper.PAPER} Table {number} ({home}) and our difference.")
    else:
        notes.append(f"No paper numbers on {family.dataset}: {paper.PAPER} Table {number} is on {home}.")
    if not any(p.method in METHOD_LABELS for p in family.points):
        notes.append(f"No run of paper 004's methods trains on {family.dataset}.")
    return notes + (unavailable_notes(family.shown_scores()) if language else [])
