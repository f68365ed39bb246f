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
from typing import Any

from caprl.tables import psst_numbers as paper
from caprl.tables.build import Scores, register_table, unavailable_notes, with_paper
from caprl.tables.operating import (FROZEN, FROZEN_LABELS, LANGUAGE, METHOD_LABELS, PSST_METHODS, RECALLS, TEST,
                                    VAL, Point, interpolate, operating_point, rho_reading, x_range)
from caprl.tables.psst_family import (Family, Rows, common_notes, curve_rows, exact_cell, fraction, frozen_kind,
                                     frozen_label, gold_notes, gold_reports, operating_note, percent, read_cells)
from caprl.tables.render import Cell, Table

ROW_ORDER = list(METHOD_LABELS)
ABLATION_CURVES = ["luo2018", "reinforce_joint"]  # Table 3's curve rows (frozen rows between them)


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
