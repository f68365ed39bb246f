"""``caprl tables``: build the tables named in params.yaml from one dataset's score files.

``caprl tables --params P --dataset DS --results-dir results/DS --out-dir results/tables``
reads ``results/DS/<run>/scores.json`` of every captioner run training on DS (see
:mod:`caprl.tables.runs`) and of the ``most-frequent`` baseline, the ``retrieval.json`` of
those runs that have one and of the listener pre-training runs (their gold captions), and writes
``<out-dir>/<DS>_<table>.{md,csv,tex}`` for every name in ``tables:``. A table is a
registered builder ``(params, dataset, scores) -> Table``; scores maps run -> score file.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from caprl import io, params as params_mod
from caprl.io import portable
from caprl.errors import CaprlError
from caprl.evaluation import clip_score
from caprl.evaluation.retrieval import GENERATED, GOLD
from caprl.registry import Registry
from caprl.params import RunSpec
from caprl.rewards import reward_unavailable_reason
from caprl.tables import published
from caprl.tables.render import Cell, Table
from caprl.tables.runs import dataset_runs, gold_retrieval_runs
from caprl.tables.settings import TableSettings

log = logging.getLogger(__name__)

METRICS = [("B@1", "BLEU-1"), ("B@2", "BLEU-2"), ("B@3", "BLEU-3"), ("B@4", "BLEU-4"),
           ("M", "METEOR"), ("R", "ROUGE-L"), ("C", "CIDEr-D"), ("S", "SPICE")]
FORMATS = {"md": Table.markdown, "csv": Table.csv, "tex": Table.latex}
BASELINE_RUN = "most-frequent"  # the trivial baseline's score file (caprl baseline)
PAPER_DATASET = "coco"  # the papers' dataset: tables show the papers' numbers beside ours
METHOD_LABELS = {"xe": "XE", "scst": "SCST", "c2f": "C2F", "pg_spider": "PG-SPIDEr", "actor_critic": "actor-critic",
                 "mixer": "MIXER"}
CIDER = [key for _, key in METRICS].index("CIDEr-D")
UNAVAILABLE = "unavailable"  # a cell of a run that could not run on this machine

Scores = dict[str, dict[str, Any]]
TableBuilder = Callable[[dict[str, Any], str, Scores], Table]
TABLES: Registry[TableBuilder] = Registry("table")


def register_table(name: str) -> Callable[[TableBuilder], TableBuilder]:
    return TABLES.register(name)


def degenerate_flags(scores: dict[str, Any] | None) -> tuple[str, ...]:
    """The footnote of a score file whose captions are degenerate (its ``warnings``, written by
    ``caprl evaluate``, :mod:`caprl.evaluation.degenerate`); () for none."""
    warnings = (scores or {}).get("warnings") or []
    if not warnings:
        return ()
    what = "; ".join(str(w.get("message", w)) if isinstance(w, dict) else str(w) for w in warnings)
    return (f"{scores.get('run', '?')}: degenerate captions: {what}. Its scores measure a collapsed model "
            "(see `warnings` in its scores.json).",)


def metric_cells(scores: dict[str, Any] | None, metrics: list[tuple[str, str]] = METRICS) -> list[Cell]:
    """Percentages as in the papers; None where the run or the metric is missing; flagged
    (:func:`degenerate_flags`) where the run's captions are degenerate."""
    values = (scores or {}).get("metrics", {})
    flags = degenerate_flags(scores)
    return [Cell(100.0 * values[key] if key in values else None, flags=flags) for _, key in metrics]


def kept_start_notes(views: list[RunSpec], scores: Scores) -> list[str]:
    """Runs that start from another run (an ``init``) and whose best validation epoch is the start
    itself (``best_epoch`` 0 in the score file): no trained epoch beat their starting weights."""
    kept = [v for v in views if v.init and (scores.get(v.name) or {}).get("best_epoch") == 0]
    return [f"{v.name}: no trained epoch beat its starting weights on validation, so its row is the start "
            f"({', '.join(f'{role} from {run}' for role, run in v.init.items())})." for v in kept]


def greedy_cell(scores: dict[str, Any] | None) -> Cell:
    """The run's greedy CIDEr-D in % (``caprl evaluate`` with ``evaluate.greedy``), flagged as its row."""
    value = ((scores or {}).get("greedy") or {}).get("metrics", {}).get("CIDEr-D")
    return Cell(None if value is None else 100.0 * value, flags=degenerate_flags(scores))


#: The main table's columns from a score file's sections (``caprl evaluate``): per section
#: (:mod:`caprl.evaluation.vocabulary`, :mod:`caprl.evaluation.failure_modes`), column, key, scale, decimals.
VOCABULARY_COLUMNS = [("Vocab", "vocab_size", 1.0, 0), ("Novel %", "novel_sentences", 100.0, 1)]
FAILURE_COLUMNS = [("Bad end %", "bad_endings", 100.0, 1), ("Rep-2 %", "repeated_bigrams", 100.0, 1),
                   ("Len", "mean_length", 1.0, 1), ("KL start", "kl_to_start", 1.0, 2)]
SECTION_COLUMNS = {"vocabulary": VOCABULARY_COLUMNS, "failure_modes": FAILURE_COLUMNS}
NO_VALUE_OK = {"kl_to_start"}  # a run without init.model (XE, the baseline) has no start to compare with
NOT_EVALUATED = "not evaluated"  # a score file written before the section existed


def vocabulary_cells(scores: dict[str, Any] | None, name: str = "vocabulary") -> list[Cell]:
    """The run's cells of section ``name`` of :data:`SECTION_COLUMNS` (vocabulary: its size and novel
    captions in %; failure_modes: bad endings and repeated bigrams in %, words per caption), flagged
    as its row; — for a missing run, "not evaluated" for a score file without the section (never a number)."""
    section = None if scores is None else scores.get(name) or {}
    flags = degenerate_flags(scores)
    cells = []
    for _, key, scale, decimals in SECTION_COLUMNS[name]:
        if section is None:
            cells.append(Cell(None, decimals=decimals))
        elif key not in section and section and key in NO_VALUE_OK:  # written, with nothing to measure: —
            cells.append(Cell(None, decimals=decimals))
        elif key not in section:
            cells.append(Cell(None, missing=NOT_EVALUATED, decimals=decimals))
        else:
            cells.append(Cell(scale * section[key], decimals=decimals, flags=flags))
    return cells


def unavailable_notes(scores: Scores) -> list[str]:
    reasons = {m: portable(r) for s in scores.values() for m, r in s.get("unavailable", {}).items()}
    return [f"{m}: not computed ({r})." for m, r in sorted(reasons.items())]


def with_paper(dataset: str, home: str = PAPER_DATASET) -> bool:
    """True where the dataset is the paper's own (``home``: the dataset of the paper's table;
    coco for most), so its numbers can stand beside ours."""
    return dataset == home


def title(settings: TableSettings, dataset: str, what: str) -> str:
    return f"{dataset} {settings.split} split: {what} ({settings.decoding()})"


def run_label(view: RunSpec, what: str) -> str:
    """A row label naming the run, so several runs of one model and method stay apart."""
    return f"{view.model} ({what}) [{view.name}]"


def method_label(method: str) -> str:
    """How the tables name a training method (its registry key in capitals if not listed)."""
    return METHOD_LABELS.get(method, method.upper())


def not_trained_reason(params: dict[str, Any], view: RunSpec, scores: Scores) -> str | None:
    """Why a run without scores could not be trained here: its ``reward`` needs what this
    machine lacks (``caprl.rewards.reward_unavailable_reason``); None for a run merely missing."""
    reward = view.options.get("reward")
    if view.name in scores or not isinstance(reward, str):
        return None
    reason = reward_unavailable_reason(reward, params)
    return None if reason is None else portable(reason)


@register_table("main")
def main_table(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """Every captioner run on the dataset (grouped by model, params order), plus the trivial baseline;
    the published numbers of the sets the dataset lists (``datasets.<name>.published``,
    :mod:`caprl.tables.published`) as the paper column of the runs that match their rows."""
    settings = TableSettings.from_params(params)
    greedy = settings.greedy
    clip = clip_score.table_columns(params, dataset, scores)  # CLIP-S, RefCLIP-S ("(listener)": not CLIP's)
    table = Table("main", title(settings, dataset, "every run"), [short for short, _ in METRICS] + ["C greedy"] * greedy
                  + [column for column, *_ in VOCABULARY_COLUMNS + FAILURE_COLUMNS]
                  + clip)
    views = dataset_runs(params, dataset)
    not_trained: list[str] = []
    compared: dict[str, list[str]] = {}  # published set -> "run = its row (config)", datasets.<name>.published
    for view in sorted(views, key=lambda v: settings.model_rank(v.model)):  # stable: params order in a model
        cells, reason = metric_cells(scores.get(view.name)), not_trained_reason(params, view, scores)
        cells += [greedy_cell(scores.get(view.name))] * greedy + vocabulary_cells(scores.get(view.name))
        cells += vocabulary_cells(scores.get(view.name), "failure_modes")
        cells += [Cell(v, flags=degenerate_flags(scores.get(view.name)))
                  for v in clip_score.table_values(params, dataset, scores.get(view.name), clip)]
        if reason is not None:
            cells = [Cell(None, missing=UNAVAILABLE) for _ in cells]
            not_trained.append(f"{view.name}: {UNAVAILABLE}, not trained here: {reason}.")
        found = published.match(params, dataset, view)
        if found is not None:
            cells = [replace(c, paper=found[2].numbers.get(column)) for c, column in zip(cells, table.columns)]
            compared.setdefault(found[0], []).append(f"{view.name} = {found[2].label} ({found[2].config})")
        table.rows.append((run_label(view, method_label(view.method)), cells))
    baseline = metric_cells(scores.get(BASELINE_RUN))
    table.rows.append(("most frequent training caption", baseline + [baseline[CIDER]] * greedy  # one caption: any decoder
                       + vocabulary_cells(scores.get(BASELINE_RUN))
                       + vocabulary_cells(scores.get(BASELINE_RUN), "failure_modes")
                       + [Cell(None) for _ in clip]))  # not scored by CLIP-S
    table.notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing."]
    if greedy:
        table.notes.append("C greedy: CIDEr-D of the greedy captions; RL training gains most there, an XE model most "
                           "from the beam. Every run's epoch is chosen on validation by the decoding of its C column "
                           "(train.validate_with: evaluation; greedy: by C greedy's).")
    table.notes.append(f"Vocab: distinct words of the run's test captions; Novel %: the share of them that is no "
                       f"training caption word for word (self-critical.pytorch's vocab_size and novel_sentences); "
                       f"{NOT_EVALUATED} = a score file written before they were.")
    table.notes.append("Reward hacking (caprl.evaluation.failure_modes): Bad end % = captions ending on one of "
                       "self-critical.pytorch's bad endings ('a', 'with', 'of', ...); Rep-2 % = seq-rep-2 (Welleck et "
                       "al. 2020: a caption's repeated word pairs over its pairs, averaged); Len = words per caption; KL start "
                       "= the summed per-step KL of the run's policy to its init.model's on its own test captions "
                       "(nats per caption, caprl.evaluation.start_kl; — for a run with no start).")
    table.notes += clip_score.table_note(params, dataset, clip)
    table.notes += published_notes(params, dataset, compared)
    table.notes += unavailable_notes(scores) + not_trained + kept_start_notes(views, scores)
    return table


def published_notes(params: dict[str, Any], dataset: str,
                    compared: dict[str, list[str]]) -> list[str]:
    """What the paper column holds: per published set the dataset lists (``datasets.<name>.published``),
    its source and conditions and the row each run is compared with, or that no run matches one."""
    notes = []
    for name, found in published.dataset_sets(params, dataset):
        runs = compared.get(name)
        what = (f"(paper x, ±d): {found.source}: {found.setting}; and our difference. Compared: {'; '.join(runs)}."
                if runs else f"{found.source} ({name}): no run here matches one of its rows (its conditions: "
                             f"{found.dataset} {found.split} split, backbone {found.backbone}, "
                             f"{', '.join(f'{k} {v}' for k, v in found.decode.items())}).")
        notes.append(what)
    return notes


def load_scores(results_dir: Path, runs: list[str], dataset: str | None = None,
                gold: Sequence[str] = ()) -> Scores:
    """``<results_dir>/<run>/scores.json`` of every run that has one; a missing run shows as —.
    Where ``<results_dir>/<run>/retrieval.json`` exists too (``caprl retrieval``), its content
    is attached as the report's ``retrieval``. The ``gold`` runs (listener pre-training: no
    scores) get ``{"run", "dataset", "retrieval"}`` where their ``retrieval.json`` (``caprl
    retrieval --gold``, the first gold captions) exists.

    A file of another run, or (when ``dataset`` is given) of another dataset, or of the other
    captions (gold for a captioner run, generated for a ``gold`` run), is an error."""
    out: Scores = {}
    for run in gold:
        p = results_dir / run / "retrieval.json"
        if p.exists():
            out[run] = {"run": run, "dataset": dataset, "retrieval": load_retrieval(p, run, dataset, GOLD)}
        else:
            log.warning("no gold-caption retrieval results for listener run %s (%s)", run, p)
    for run in runs:
        p = results_dir / run / "scores.json"
        if not p.exists():
            log.warning("no scores for run %s (%s): its cells will show as missing", run, p)
            continue
        report = io.read_json(p, "score file")
        if not isinstance(report, dict) or "run" not in report or "metrics" not in report:
            raise CaprlError(f"{p}: not a caprl score file (needs 'run' and 'metrics')")
        if report["run"] != run:
            raise CaprlError(f"{p}: holds the scores of run '{report['run']}', not of '{run}'")
        if dataset is not None and report.get("dataset", dataset) != dataset:
            raise CaprlError(f"{p}: scores of dataset '{report['dataset']}', not of --dataset {dataset}")
        retrieval = results_dir / run / "retrieval.json"
        if retrieval.exists():
            report["retrieval"] = load_retrieval(retrieval, run, dataset, GENERATED)
        out[run] = report
    return out


def load_retrieval(path: Path, run: str, dataset: str | None = None, captions: str = GENERATED) -> dict[str, Any]:
    """A ``caprl retrieval`` report of ``run`` (of ``dataset`` where given) ranked by ``captions``
    (``generated``, also a report written before the key existed, or ``gold``), else CaprlError."""
    report = io.read_json(path, "retrieval report")
    if not isinstance(report, dict) or "run" not in report or "R@10" not in report:
        raise CaprlError(f"{path}: not a caprl retrieval report (needs 'run' and 'R@10')")
    if report["run"] != run:
        raise CaprlError(f"{path}: holds the retrieval results of run '{report['run']}', not of '{run}'")
    if dataset is not None and report.get("dataset", dataset) != dataset:
        raise CaprlError(f"{path}: retrieval results of dataset '{report['dataset']}', not of --dataset {dataset}")
    if report.get("captions", GENERATED) != captions:
        option = "--gold" if captions == GOLD else "--captions"
        raise CaprlError(f"{path}: retrieval by the {report.get('captions', GENERATED)} captions, but run '{run}' is "
                         f"ranked by its {captions} captions (caprl retrieval {option})")
    return report


def build_tables(params: dict[str, Any], dataset: str, scores: Scores,
                 only: list[str] | None = None) -> dict[str, Table]:
    """The tables of the dataset (its ``tables:`` or the top-level list; ``only``: these of
    them), by name."""
    names = params_mod.dataset_tables(params, dataset)
    key = f"datasets.{dataset}.tables" if "tables" in params["datasets"][dataset] else "tables"
    unknown = [name for name in names if name not in TABLES]
    if unknown:
        raise CaprlError(f"{key}: unknown table(s) {', '.join(unknown)}; registered: {', '.join(sorted(TABLES))}")
    absent = [name for name in only or [] if name not in names]
    if absent:
        raise CaprlError(f"--table {absent[0]}: not a table of dataset {dataset} ({key}: {', '.join(names)})")
    return {name: TABLES[name](params, dataset, scores) for name in (only or names)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="a key of params.yaml datasets: (names the tables)")
    parser.add_argument("--results-dir", required=True, help="holds <run>/scores.json of every run on the dataset")
    parser.add_argument("--out-dir", required=True, help="writes <dataset>_<table>.md, .csv and .tex here")
    parser.add_argument("--table", action="append", default=None,
                        help="build only this table (repeatable; default: every table of the dataset)")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    dataset = params_mod.dataset_spec(params, args.dataset)["name"]  # CaprlError naming datasets.<name>
    runs = [view.name for view in dataset_runs(params, dataset)] + [BASELINE_RUN]
    gold = [view.name for view in gold_retrieval_runs(params, dataset)]
    scores = load_scores(Path(args.results_dir), runs, dataset, gold)
    for name, table in build_tables(params, dataset, scores, args.table).items():
        for ext, render in FORMATS.items():
            io.write_text(Path(args.out_dir) / f"{dataset}_{name}.{ext}", render(table))
        log.info("table %s written to %s", name, os.fspath(args.out_dir))
