"""Paper 004's Tables 1, 2, 3 and 6 (discriminative captioning, PSST), filled with this pipeline's runs.

Each method's runs on the dataset (several λ; PSST rows: ``rho == discriminative.table_rho``)
form a curve (:mod:`caprl.tables.operating`), read by linear interpolation at the table's
operating point (``discriminative.operating_points.<dataset>``: a number, or auto). An auto
operating point is chosen on the validation curves (each score file's ``validation``: the val
numbers of the epoch its evaluated checkpoint holds, written by ``caprl evaluate``,
:mod:`caprl.evaluation.validation`), and the test curves are read there; for score reports
without them (made by hand), on the test curves (the table says which):

* ``psst_table1`` / ``psst_table6``: CIDEr-D, BLEU-4, METEOR, ROUGE-L, SPICE (fractions, as
  the paper prints them) at a fixed R@5 (``recall5``; paper: 80% on COCO, 90% on Flickr30K).
  Paper numbers beside ours on coco (Table 1) / flickr30k (Table 6).
* ``psst_table2``: R@1, R@5, R@10 (%) at a fixed CIDEr-D (``cider``; paper: 1.2 on COCO).
* ``psst_table3``: the ablations at a fixed CIDEr-D (``ablation_cider``; paper 1.13; auto:
  the Frozen-speaker (Luo) run's own CIDEr-D): Luo et al. and REINFORCE curves, and the
  frozen-speaker runs (single points, their own CIDEr-D), named by their init run's method.
* ``psst_points``: every run of the family with its λ, ρ, language metrics and recalls.

``psst_table2``, ``psst_table3`` and ``psst_points`` also give, as a note (``psst_points``: a
row too), the recall of each listener pre-training run (method ``listener``) by the first gold
caption of every image of the split (``caprl retrieval --gold``): an upper reference for the
generated captions' recall.

A cell is "—" where the method has no run with both scores and retrieval results, or where
its curve does not reach the operating point (the notes give the curve's range): its test
curve, or, where the point was chosen on validation, its validation curve (the test numbers are
read where the validation curve reaches the point: ``caprl.tables.operating.read_curve``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from caprl.tables import psst_numbers as paper
from caprl.tables.build import Scores, degenerate_flags, register_table, unavailable_notes, with_paper
from caprl.tables.operating import (FROZEN, FROZEN_LABELS, LANGUAGE, METHOD_LABELS, PSST_METHODS, RECALLS, TEST,
                                    VAL, Curve, OperatingPoint, Point, curve, decode_text, family_points,
                                    interpolate, method_points, models_of, on_validation, operating_point,
                                    overlap_value, read_curve, rho_reading, table_rho, x_range)
from caprl.tables.render import Cell, Table
from caprl.tables.runs import gold_retrieval_runs
from caprl.tables.settings import TableSettings

Rows = list[tuple[str, list[Cell]]]
ROW_ORDER = list(METHOD_LABELS)
ABLATION_CURVES = ["luo2018", "reinforce_joint"]  # Table 3's curve rows (frozen rows between them)


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


# ---------------------------------------------------------------- Tables 1 and 6


def _language_table(name: str, number: int, numbers: dict[str, dict[str, float]], params: dict[str, Any],
                    dataset: str, scores: Scores) -> Table:
    family, home = Family(params, dataset, scores), paper.HOME[name]
    here = with_paper(dataset, home)
    op = operating_point(params, dataset, "recall5", lambda: family.auto(ROW_ORDER, "R@5", "CIDEr-D"),
                         paper.OPERATING_POINTS.get(dataset, {}).get("recall5"), family.split)
    table = Table(name, family.title(f"Table {number}, language metrics at a fixed R@5 = {op.describe(percent)}"),
                  list(LANGUAGE))
    notes: list[str] = []
    table.rows = curve_rows(family, ROW_ORDER, "R@5", LANGUAGE, op, 1.0, 3, numbers if here else None, percent, notes)
    table.notes = common_notes(family, f"R@5 = {op.describe(percent)}", home, number, here, True)
    table.notes.append("Language metrics as fractions (CIDEr-D 1.0 = 100 in %), official coco-caption "
                       "implementations, as the paper prints them.")
    if here:
        table.notes.append(paper.TABLE6_LUO_NOTE if number == 6 else
                           f"The paper's Table {number} has no Luo et al. 2018 row.")
    table.notes += operating_note(op, "R@5")
    if op.auto and op.split == VAL:
        table.notes.append("Validation R@5 ranks among the val images, test R@5 among the test images: the two "
                           "scales match only where both splits have as many images (paper 004's claims config "
                           "sets n_val = n_test).")
    table.notes += notes
    return table


@register_table("psst_table1")
def psst_table1(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Paper 004 Table 1: language metrics at a fixed R@5 (paper: 80%, COCO)."""
    return _language_table("psst_table1", 1, paper.TABLE1, params, dataset, scores)


@register_table("psst_table6")
def psst_table6(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Paper 004 Table 6: Table 1 on Flickr30K (paper: R@5 = 90%)."""
    return _language_table("psst_table6", 6, paper.TABLE6, params, dataset, scores)


# ---------------------------------------------------------------- Table 2


@register_table("psst_table2")
def psst_table2(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Paper 004 Table 2: R@1, R@5, R@10 at a fixed CIDEr-D (paper: 1.2, COCO)."""
    family, home = Family(params, dataset, scores), paper.HOME["psst_table2"]
    here = with_paper(dataset, home)
    op = operating_point(params, dataset, "cider", lambda: family.auto(ROW_ORDER, "CIDEr-D", "R@10"),
                         paper.OPERATING_POINTS.get(dataset, {}).get("cider"), family.split)
    table = Table("psst_table2", family.title(f"Table 2, recall at a fixed CIDEr-D = {op.describe(fraction)}"),
                  list(RECALLS))
    notes: list[str] = []
    table.rows = curve_rows(family, ROW_ORDER, "CIDEr-D", RECALLS, op, 100.0, 1, paper.TABLE2 if here else None,
                            fraction, notes)
    table.notes = common_notes(family, f"CIDEr-D = {op.describe(fraction)}", home, 2, here, False)
    table.notes += ["Recall in %.", *operating_note(op, "CIDEr-D")] + notes + gold_notes(params, dataset, scores)
    return table


# ---------------------------------------------------------------- Table 3


def frozen_points(family: Family) -> dict[str, list[Point]]:
    """The frozen-speaker runs by row label (Luo first, then MLE, then other init methods)."""
    order = list(FROZEN_LABELS.values())
    groups: dict[str, list[Point]] = {}
    for p in family.points:
        if p.method == FROZEN:
            groups.setdefault(family.label(frozen_label(p), p.spec.model), []).append(p)
    return dict(sorted(groups.items(), key=lambda kv: (order.index(frozen_label(kv[1][0]))
                                                       if frozen_label(kv[1][0]) in order else len(order))))


def _ablation_auto(family: Family) -> float | None:
    """The Frozen-speaker (Luo) run's CIDEr-D (validation: its val CIDEr-D), else the overlap value of
    the Luo and REINFORCE curves (validation curves where the runs carry validation numbers)."""
    luo = [p for p in family.points if p.method == FROZEN and p.init_method == "luo2018"
           and (p.complete if family.split == TEST else "CIDEr-D" in p.val)]
    if luo:
        return luo[0].numbers(family.split)["CIDEr-D"]
    return family.auto(ABLATION_CURVES, "CIDEr-D", "R@10")


@register_table("psst_table3")
def psst_table3(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Paper 004 Table 3: ablations (frozen speakers) beside Luo et al. and REINFORCE at a fixed CIDEr-D."""
    family, home = Family(params, dataset, scores), paper.HOME["psst_table3"]
    here = with_paper(dataset, home)
    paper_cider = paper.OPERATING_POINTS["coco"]["ablation_cider"] if here else None
    op = operating_point(params, dataset, "ablation_cider", lambda: _ablation_auto(family),
                         paper.OPERATING_POINTS.get(dataset, {}).get("ablation_cider"), family.split)
    table = Table("psst_table3", family.title(f"Table 3, ablations at a fixed CIDEr-D = {op.describe(fraction)}"),
                  ["CIDEr-D", *RECALLS])
    notes: list[str] = []

    def numbers(kind: str) -> dict[str, float] | None:
        return paper.TABLE3.get(kind) if here else None

    def curve_row(method: str) -> Rows:
        rows = curve_rows(family, [method], "CIDEr-D", RECALLS, op, 100.0, 1, {method: numbers(method) or {}},
                          fraction, notes)
        out = []
        for model, (label, cells) in zip(family.models, rows):  # and the test CIDEr-D read there
            runs = [p for p in family.runs(method, model) if p.complete]
            cider = read_cells(runs, "CIDEr-D", ["CIDEr-D"], op, 1.0, 3, {"CIDEr-D": paper_cider})
            out.append((label, [*cider, *cells]))
        return out

    table.rows += curve_row("luo2018")
    for label, points in frozen_points(family).items():
        inits = [p.init_run for p in points]
        for p in points:
            row_label = label if len(points) == 1 else f"{label} [init {p.init_run}]"
            if inits.count(p.init_run) > 1:  # several frozen speakers of one init run: name the run too
                row_label = f"{label} [init {p.init_run}, run {p.spec.name}]"
            cider = p.values.get("CIDEr-D")
            recalls = numbers(frozen_kind(p)) or {}
            table.rows.append((row_label, [Cell(cider, paper_cider, decimals=3)]
                               + [Cell(100.0 * p.values[k] if k in p.values else None, recalls.get(k))
                                  for k in RECALLS]))
            if not p.complete:
                notes.append(f"{row_label}: run {p.spec.name} lacks scores or retrieval results.")
    table.rows += curve_row("reinforce_joint")
    table.notes = common_notes(family, f"CIDEr-D = {op.describe(fraction)}", home, 3, here, False)
    table.notes += ["Recall in %. Frozen Speaker rows: the speaker of their init run (Luo = a luo2018 run, "
                    "MLE = an xe run) kept frozen and the listener trained on its captions; each run is one point, "
                    "shown at its own CIDEr-D (auto operating point: the Frozen Speaker (Luo) run's CIDEr-D; its val "
                    "CIDEr-D where the runs carry validation numbers)."] + operating_note(op, "CIDEr-D") + notes
    if not frozen_points(family):
        table.notes.append(f"No {FROZEN} run trains on {dataset}.")
    table.notes += gold_notes(params, dataset, scores)
    return table


# ---------------------------------------------------------------- every point


POINT_COLUMNS = ["λ", "ρ", *LANGUAGE, *RECALLS, "mean rank"]
GOLD_LABEL = "Listener, first gold caption"  # psst_points' row of a listener run (caprl retrieval --gold)


@register_table("psst_points")
def psst_points(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Every run of paper 004's family on the dataset: λ, ρ, language metrics, recall, mean rank."""
    family = Family(params, dataset, scores)
    order = [*METHOD_LABELS, FROZEN]
    models = {m: i for i, m in enumerate(family.settings.models)}
    points = sorted(family.points, key=lambda p: (order.index(p.method), models.get(p.spec.model, 0),
                                                  p.rho or 0.0, p.lam or 0.0))
    table = Table("psst_points", family.title("every run of the discriminative methods (the curves' points)"),
                  POINT_COLUMNS)
    for p in points:
        label = frozen_label(p) if p.method == FROZEN else METHOD_LABELS[p.method]
        v = p.values
        cells = [exact_cell(p.lam), exact_cell(p.rho)]
        cells += [Cell(v.get(k), decimals=3) for k in LANGUAGE]
        cells += [Cell(100.0 * v[k] if k in v else None) for k in RECALLS]
        cells.append(Cell(v.get("mean_rank")))
        cells = [dataclasses.replace(c, flags=family.flags([p])) for c in cells]
        table.rows.append((f"{family.label(label, p.spec.model)} [{p.spec.name}]", cells))
    for run, report in gold_reports(params, dataset, scores).items():  # the listeners' upper reference
        if report is not None:
            cells = [Cell(None) for _ in range(2 + len(LANGUAGE))]  # no λ, ρ, nor captions of its own
            cells += [Cell(100.0 * report[k] if k in report else None) for k in RECALLS]
            table.rows.append((f"{GOLD_LABEL} [{run}]", cells + [Cell(report.get("mean_rank"))]))
    table.notes = ["Language metrics as fractions (official coco-caption implementations); R@K in % and mean rank "
                   "of the run's own listener over every image of the split; — = not evaluated (no scores.json or "
                   "retrieval.json) or not an option of the method.",
                   "Frozen Speaker (Luo / MLE): a frozen_speaker run whose init model is a luo2018 / xe run."]
    if not points:
        table.notes.append(f"No run of paper 004's methods trains on {dataset}.")
    table.notes += unavailable_notes(family.shown_scores()) + gold_notes(params, dataset, scores)
    return table


# ---------------------------------------------------------------- Fig. 4's numbers


@register_table("psst_rho")
def psst_rho(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """The numbers of paper 004's Fig. 4: R@10 at a fixed CIDEr-D (``rho_cider``) of each PSST
    method's ρ curves (ρ = 0: its ST method's curve where no PSST run has ρ = 0)."""
    family = Family(params, dataset, scores)
    curves, op = rho_reading(params, dataset, family.points, family.models)  # as the figure reads them
    rhos = sorted({rho for per_rho, _ in curves.values() for rho in per_rho})
    table = Table("psst_rho", family.title(f"Fig. 4, R@10 at a fixed CIDEr-D = {op.describe(fraction)} against ρ"),
                  [f"ρ = {rho:g}" for rho in rhos])
    borrowed, outside = [], []
    for (method, model), (per_rho, from_st) in curves.items():
        label = family.label(METHOD_LABELS[method], model)
        cells = [Cell(None if op.value is None or rho not in per_rho or (y := interpolate(per_rho[rho], op.value))
                      is None else 100.0 * y) for rho in rhos]
        table.rows.append((label, cells))
        for rho, c in per_rho.items():
            span = x_range(c)
            if op.value is not None and span is not None and not span[0] <= op.value <= span[1]:
                outside.append(f"{label}, ρ = {rho:g}: its runs' {'val ' if op.split == VAL else ''}CIDEr-D spans "
                               f"{fraction(span[0])}–"
                               f"{fraction(span[1])}, not {fraction(op.value)}.")
        if from_st:
            borrowed.append(METHOD_LABELS[PSST_METHODS[method]])
    table.notes = ["R@10 in %, read on each ρ's λ curve (CIDEr-D, R@10) by linear interpolation; — = the curve "
                   "does not reach the operating point, or no run.", *operating_note(op, "CIDEr-D"), *outside]
    if borrowed:
        table.notes.append(f"ρ = 0: the {' / '.join(dict.fromkeys(borrowed))} runs (ST = PSST with ρ = 0).")
    return table
