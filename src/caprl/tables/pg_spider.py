"""PG-SPIDEr (Liu et al., ICCV 2017): policy gradient with Monte-Carlo roll-outs, per reward.

For every model with ``pg_spider`` or ``mixer`` runs on the dataset (models in params
order): the model's XE run(s) (the paper's "MLE"), its SCST run(s), its MIXER run(s) (Ranzato et
al. 2016, the paper's comparison baseline, labelled as the paper does; the summary gives no MIXER
numbers), then one row per ``pg_spider`` run, named as the paper names policy gradient on each
reward (:data:`PG_NAMES`: PG-CIDEr, PG-BCMR, PG-SPIDEr, PG-SPICE; PG-SPIDEr is PG on SPIDEr only;
another reward of ``rewards:`` shows its key). Rows are chosen by method, never by run name. Columns are
BLEU-4, METEOR, ROUGE-L, CIDEr-D, SPICE and SPIDEr = (CIDEr-D + SPICE) / 2, computed here
from the score file; where SPICE was not computed SPIDEr shows as unavailable (the notes say
why), never as a number. A PG-SPIDEr run whose reward cannot run on this machine
(``caprl.rewards.reward_unavailable_reason``; e.g. SPICE without its CoreNLP jars) was
never trained: without a score file its row says why it is unavailable (MIXER's likewise).
"""

from __future__ import annotations

from typing import Any

from caprl.errors import CaprlError
from caprl.params import RunSpec
from caprl.tables.build import (UNAVAILABLE, Scores, method_label, metric_cells, not_trained_reason,
                                register_table, run_label, title, unavailable_notes)
from caprl.tables.render import Cell, Table
from caprl.tables.runs import select
from caprl.tables.settings import TableSettings

METHOD = "pg_spider"
BASELINES = ["xe", "scst", "mixer"]  # the methods of the rows before a model's PG-SPIDEr rows (in this order)
BASELINE_NAMES = {"xe": "MLE"}  # the paper's names where they are not the tables' (method_label)
#: the paper's name of policy gradient on each reward of rewards: (Liu et al. 2017: PG-<metric>)
PG_NAMES = {"cider_d": "PG-CIDEr", "bcmr": "PG-BCMR", "spider": "PG-SPIDEr", "spice": "PG-SPICE"}
SHOWN_BY = [METHOD, "mixer"]  # a model with runs of these methods gets its rows
METRICS = [("B@4", "BLEU-4"), ("M", "METEOR"), ("R", "ROUGE-L"), ("C", "CIDEr-D"), ("S", "SPICE")]
SPIDER = ("SPIDEr", ("CIDEr-D", "SPICE"))  # column, the metrics averaged
COLUMNS = [short for short, _ in METRICS] + [SPIDER[0]]


def spider_cell(scores: dict[str, Any] | None) -> Cell:
    """SPIDEr in %, or why not: missing run (—), a component metric not computed (unavailable:
    the table's notes give the metric's reason), or not evaluated."""
    if scores is None:
        return Cell(None)
    values, parts = scores.get("metrics", {}), SPIDER[1]
    for metric in parts:
        if metric not in values:
            computed = metric in scores.get("unavailable", {})
            return Cell(None, missing=UNAVAILABLE if computed else "not evaluated")
    return Cell(100.0 * sum(values[m] for m in parts) / len(parts))


def row_cells(scores: dict[str, Any] | None) -> list[Cell]:
    return metric_cells(scores, METRICS) + [spider_cell(scores)]


def pg_name(view: RunSpec) -> str:
    """The paper's name of a ``pg_spider`` run: PG on its reward (:data:`PG_NAMES`; else PG, the reward's key)."""
    reward = reward_of(view)
    return PG_NAMES.get(reward, f"PG, {reward}")


def reward_of(view: RunSpec) -> str:
    reward = view.options.get("reward")
    if not isinstance(reward, str):
        raise CaprlError(f"runs.{view.name}.options.reward: a pg_spider run needs a reward name "
                         f"(a key of rewards:), got {reward!r}")
    return reward


def model_rows(params: dict[str, Any], dataset: str, scores: Scores, model: str,
               pg_runs: list[RunSpec], notes: list[str]) -> list[tuple[str, list[Cell]]]:
    """The model's XE and SCST rows (one missing row when it has none), then its PG-SPIDEr rows;
    why a PG-SPIDEr run could not be trained here goes to ``notes``."""
    rows = []
    for method in BASELINES:
        views = select(params, dataset, model=model, method=method)
        name = BASELINE_NAMES.get(method, method_label(method))
        rows += [run_row(params, scores, v, run_label(v, name), notes) for v in views]
        if not views:
            rows.append((f"{model} ({name}): no run", row_cells(None)))
    rows += [run_row(params, scores, v, run_label(v, pg_name(v)), notes) for v in pg_runs]
    return rows


def run_row(params: dict[str, Any], scores: Scores, view: RunSpec, label: str,
            notes: list[str]) -> tuple[str, list[Cell]]:
    """A run's row, or "unavailable" cells (and why, in ``notes``) for a run that could not train here."""
    reason = not_trained_reason(params, view, scores)
    if reason is None:
        return label, row_cells(scores.get(view.name))
    notes.append(f"{view.name}: {UNAVAILABLE}, not trained here: {reason}.")
    return label, [Cell(None, missing=UNAVAILABLE) for _ in COLUMNS]


@register_table("pg_spider")
def pg_spider_table(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Policy gradient per reward (PG-CIDEr, PG-BCMR, PG-SPIDEr) beside the same model's MLE, SCST and MIXER runs."""
    settings = TableSettings.from_params(params)
    table = Table("pg_spider", title(settings, dataset, "PG-SPIDEr (Liu et al. 2017) per reward"), list(COLUMNS))
    pg_runs = select(params, dataset, method=METHOD)
    models = sorted(dict.fromkeys(v.model for m in SHOWN_BY for v in select(params, dataset, method=m)),
                    key=settings.model_rank)
    not_trained: list[str] = []
    for model in models:
        table.rows += model_rows(params, dataset, scores, model, [v for v in pg_runs if v.model == model],
                                 not_trained)
    shown = {v.name for v in pg_runs} | {v.name for model in models for method in BASELINES
                                          for v in select(params, dataset, model=model, method=method)}
    table.notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing run. "
                   "SPIDEr = (CIDEr-D + SPICE) / 2, from the scores; unavailable where SPICE was not computed.",
                   "PG-<reward> = policy gradient with K Monte-Carlo roll-outs and a learned baseline on that reward "
                   "(PG-CIDEr: CIDEr-D), as the paper names its runs; MLE = the cross-entropy start.",
                   "MIXER = Ranzato et al. 2016 (XE on the first M words, REINFORCE on the rest, M annealed to 0), "
                   "the paper's comparison baseline; the paper's summary gives no MIXER numbers."]
    if not pg_runs:
        table.notes.append(f"No {METHOD} run trains on {dataset}.")
    table.notes += unavailable_notes({run: s for run, s in scores.items() if run in shown}) + not_trained
    return table
