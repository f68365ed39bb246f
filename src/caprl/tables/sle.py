"""The SLE paper's Tables 2-4 and Fig. 2 / 4, filled with this pipeline's runs.

Chen & Jin, "Better Captioning with Sequence-Level Exploration" (CVPR 2020); its numbers
are in :mod:`caprl.tables.sle_numbers`. Rows are found from params.yaml, never from run
names: a row kind (:data:`ROW_KINDS`) is a method, and for ``sll`` whether the run's
``entropy`` option is > 0 (SLL-ME) or not (SLL). SLL is SCST under the paper's name (the
``sll`` objective is ``scst``'s class), with the paper's own options (params.yaml
``objectives.sll``: its reward text, its fresh optimiser): an ``scst`` run is never an SLL row.
The models shown are those with an ``sll`` or ``sll_sle`` run on the dataset: models without
attention first, then those with attention (marked *, as the paper marks its attention rows),
params order within. A model attends over regions when its architecture's config has an
attention size (``att_hidden_size``: topdown, softatt, stackcap, ...; fc and lstm3 have none). A kind
without a run shows as one missing row; several runs of a kind give a row each, named.

* ``sle_table2`` (image) / ``sle_table3`` (video): METEOR, CIDEr-D, SPICE in % of the
  evaluation decoding. On the paper's own dataset (coco for Table 2, tgif for Table 3)
  every cell the paper has a number for carries it, and the paper's prior methods are
  listed as paper-only rows. Where the paper's text and table disagree the notes say so
  (:func:`caprl.tables.sle_numbers.text_notes`): Table 3 prints its SLL and SLL-ME rows
  swapped relative to sec. 5.3, so our rows are compared with the text's assignment and the
  printed rows are listed as "as printed [paper]" rows; Table 2's stated CIDEr gain of
  SLL-SLE over SLL-ME (1.8) is not the table's (1.6).
* ``sle_table4``: precision (CIDEr-D in %: rs = the mean over an image's 5 samples, sec.
  5.4; bs = the top beam's, as the paper's bs CIDEr equal its Table 2) and diversity (Div-1,
  Div-2, mBLEU-4, fractions with 2 decimals as the paper prints them, and Self-CIDEr, which
  the paper does not report: :mod:`caprl.evaluation.self_cider`) of 5 random samples
  (rs) and the top 5 beams (bs) per test image, from the score file's ``diversity``
  section; a score file without it shows "not evaluated". A section written before the bs
  CIDEr-D was the top beam's (no ``settings.precision``: it holds the mean over the beams)
  shows the run's main beam score where its width is the bs width, else "not evaluated".
  Paper numbers on coco, beside the rows of models without attention (the paper's Table 4
  is that model).
* ``sle_samples``: Fig. 2 / 4, the random samples of XE, SLL and SLL-SLE side by side for
  the same test images, with the images' references.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from caprl.evaluation.diversity import TABLE4_PRECISION
from caprl.params import RunSpec
from caprl.tables import sle_numbers as paper
from caprl.tables.build import (UNAVAILABLE, Scores, degenerate_flags, metric_cells, not_trained_reason,
                                register_table, run_label, title, unavailable_notes)
from caprl.tables.render import MISSING, Cell, Table
from caprl.tables.runs import dataset_runs, select
from caprl.tables.settings import TableSettings

NOT_EVALUATED = "not evaluated"  # a run scored before the diversity section existed


@dataclass(frozen=True)
class RowKind:
    label: str  # as the paper names the row
    method: str  # the runs' objective (registry key)
    entropy: bool | None = None  # True: entropy option > 0 only; False: == 0 only; None: any


ROW_KINDS: dict[str, RowKind] = {
    "xe": RowKind("XE", "xe"),
    "sll": RowKind("SLL", "sll", entropy=False),  # caprl.objectives.scst: SequenceLevel
    "sll_me": RowKind("SLL-ME", "sll", entropy=True),
    "sll_sle": RowKind("SLL-SLE", "sll_sle"),
}
RL_KINDS = ["sll", "sll_me", "sll_sle"]  # the kinds that make a model part of these tables
TABLE4_KINDS = ["xe", *RL_KINDS]
SAMPLE_KINDS = ["xe", "sll", "sll_sle"]  # Fig. 2 / Fig. 4
DECODINGS = {"rs": "random sampling", "bs": "beam search"}
MCS = [("M", "METEOR"), ("C", "CIDEr-D"), ("S", "SPICE")]
PAPER_DATASETS = {"sle_table2": "coco", "sle_table3": "tgif", "sle_table4": "coco"}

Rows = list[tuple[str, list[Cell]]]


def text_cell(text: str | None) -> Cell:
    """A cell holding text (a caption; None: —): Cell shows ``missing`` in place of a number, in
    every rendering (Markdown, LaTeX, and the CSV's column of our values)."""
    return Cell(None, missing=MISSING if text is None else text)


# ---------------------------------------------------------------- rows from params


def has_attention(params: dict[str, Any], model: str) -> bool:
    from caprl.models import MODELS

    cls = MODELS.get(params["models"][model]["arch"], where=f"models.{model}.arch")
    return any(f.name == "att_hidden_size" for f in dataclasses.fields(cls.config_class))


def kind_runs(params: dict[str, Any], dataset: str, model: str, kind: str) -> list[RunSpec]:
    """The model's runs on the dataset of this row kind (params order)."""
    spec = ROW_KINDS[kind]
    return [v for v in select(params, dataset, model=model, method=spec.method)
            if spec.entropy is None or (float(v.options.get("entropy") or 0.0) > 0.0) == spec.entropy]


def sle_models(params: dict[str, Any], dataset: str) -> list[str]:
    """Models with an SLL / SLL-ME / SLL-SLE run on the dataset: without attention first."""
    methods = {ROW_KINDS[k].method for k in RL_KINDS}
    names = list(params["models"])
    models = dict.fromkeys(v.model for v in dataset_runs(params, dataset) if v.method in methods)
    return sorted(models, key=lambda m: (has_attention(params, m), names.index(m)))


def mcs_cells(scores: dict[str, Any] | None) -> list[Cell]:
    return [Cell(c.ours, decimals=1, flags=c.flags) for c in metric_cells(scores, MCS)]


def kind_label(params: dict[str, Any], model: str, kind: str) -> str:
    return ROW_KINDS[kind].label + ("*" if has_attention(params, model) else "")


def kind_rows(params: dict[str, Any], dataset: str, scores: Scores, model: str, kind: str, what: str,
              cells: Callable[[dict[str, Any] | None], list[Cell]], notes: list[str]) -> Rows:
    """One row per run of the kind (a missing row if none); a run that cannot train here says so."""
    views = kind_runs(params, dataset, model, kind)
    if not views:
        return [(f"{model} ({what}): no run", cells(None))]
    rows = []
    for view in views:
        reason = not_trained_reason(params, view, scores)
        row = cells(scores.get(view.name))
        if reason is not None:
            row = [dataclasses.replace(c, ours=None, missing=UNAVAILABLE) for c in row]
            notes.append(f"{view.name}: {UNAVAILABLE}, not trained here: {reason}.")
        rows.append((run_label(view, what), row))
    return rows


def with_numbers(rows: Rows, numbers: dict[str, float] | None, keys: list[str]) -> Rows:
    """The rows with the paper's number (by column key) in every cell it has one for."""
    if numbers is None:
        return rows
    return [(label, [dataclasses.replace(c, paper=numbers.get(k)) for c, k in zip(cells, keys)])
            for label, cells in rows]


def shown_scores(params: dict[str, Any], dataset: str, scores: Scores, models: list[str],
                 kinds: list[str]) -> Scores:
    runs = {v.name for m in models for k in kinds for v in kind_runs(params, dataset, m, k)}
    return {run: s for run, s in scores.items() if run in runs}


def paper_only_rows(rows: list[tuple[str, dict[str, float]]], keys: list[str]) -> Rows:
    return [(f"{label} [paper]", [Cell(None, row.get(k), decimals=1) for k in keys]) for label, row in rows]


def _paper_note(name: str, dataset: str, number: int, what: str) -> str:
    home = PAPER_DATASETS[name]
    if dataset == home:
        return (f"(paper x, ±d): {paper.PAPER} Table {number}, {what}, and our difference; "
                "[paper] rows are the paper's other methods (— = NA in the paper).")
    return f"No paper numbers on {dataset}: paper numbers are shown on {home} ({paper.PAPER} Table {number} is {what})."


KIND_NOTE = "Rows by method: SLL = sll with entropy 0, SLL-ME = sll with entropy > 0, SLL-SLE = sll_sle."


# ---------------------------------------------------------------- Tables 2 and 3


def _mcs_table(name: str, number: int, what: str, where: str, prior: list[tuple[str, dict[str, float]]],
               numbers: dict[bool, dict[str, dict[str, float]]], params: dict[str, Any], dataset: str,
               scores: Scores) -> Table:
    table = Table(name, title(TableSettings.from_params(params), dataset, f"{paper.PAPER} Table {number}, {what}"),
                  [short for short, _ in MCS])
    keys = [short for short, _ in MCS]
    home = dataset == PAPER_DATASETS[name]
    if home:
        table.rows += paper_only_rows(prior + paper.printed_rows(number), keys)
    models, not_trained, no_paper = sle_models(params, dataset), [], []
    for model in models:
        attention = has_attention(params, model)
        if home and attention not in numbers:
            no_paper.append(f"{model} ({'with' if attention else 'without'} attention)")
        for kind in RL_KINDS:
            rows = kind_rows(params, dataset, scores, model, kind, kind_label(params, model, kind),
                             mcs_cells, not_trained)
            table.rows += with_numbers(rows, numbers.get(attention, {}).get(kind) if home else None, keys)
    table.notes = ["Scores in %, official coco-caption implementations (pycocoevalcap); — = missing run or "
                   "metric. * = a model with attention.", KIND_NOTE, _paper_note(name, dataset, number, where)]
    if home:
        table.notes += paper.text_notes(number)
    if no_paper:
        table.notes.append(f"The paper's Table {number} has no such rows: no paper numbers for "
                           f"{', '.join(no_paper)}.")
    if not models:
        table.notes.append(f"No sll / sll_sle run trains on {dataset}.")
    table.notes += unavailable_notes(shown_scores(params, dataset, scores, models, RL_KINDS)) + not_trained
    return table


@register_table("sle_table2")
def sle_table2(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """SLE Table 2 (image captioning): SLL, SLL-ME, SLL-SLE per model; the paper's on coco."""
    return _mcs_table("sle_table2", 2, "image captioning", "MSCOCO Karpathy test, beam 5", paper.TABLE2_PRIOR,
                      paper.TABLE2, params, dataset, scores)


@register_table("sle_table3")
def sle_table3(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """SLE Table 3 (video captioning): SLL, SLL-ME, SLL-SLE per model; the paper's on tgif, with
    its SLL and SLL-ME rows as the text assigns them (printed swapped; both shown, a note says so)."""
    return _mcs_table("sle_table3", 3, "video captioning", "TGIF official test split, beam 5",
                      paper.TABLE3_PRIOR, paper.TABLE3_TEXT, params, dataset, scores)


# ---------------------------------------------------------------- Table 4

#: column, key in the paper's Table 4 rows, key in the score file's diversity section, scale, decimals
TABLE4_COLUMNS = [("CIDEr-D", "C", "CIDEr-D", 100.0, 1), ("Div-1", "Div-1", "Div-1", 1.0, 2),
                  ("Div-2", "Div-2", "Div-2", 1.0, 2), ("mBLEU-4", "mBLEU-4", "mBLEU-4", 1.0, 2),
                  ("Self-CIDEr", "Self-CIDEr", "Self-CIDEr", 1.0, 2)]  # not in the paper: SCP's eval_multi
TABLE4_KEYS = [key for _, key, _, _, _ in TABLE4_COLUMNS]
PRECISION_KEY = "CIDEr-D"  # the score-file key of the precision column (reduced per decoding)
PRECISION_WORDS = {"mean": "the mean over the captions", "top": "the top beam's"}  # caprl.evaluation.diversity


def precision_of(scores: dict[str, Any], decoding: str, notes: list[str]) -> float | None:
    """The decoding's CIDEr-D as the paper reports it (:data:`TABLE4_PRECISION`), or None. A
    section reduced otherwise (written before ``settings.precision`` existed: the mean over
    the captions) is replaced, for the top beam, by the run's main score when it is a beam
    search of the bs width (the same beam search, so the same top beam); a note says so."""
    section = scores["diversity"]
    made = (section.get("settings") or {}).get("precision", {}).get(decoding, "mean")
    wanted = TABLE4_PRECISION[decoding]
    if made == wanted:
        return section[decoding].get("CIDEr-D")
    run, width = scores.get("run", "?"), (section.get("settings") or {}).get("beams")
    main = scores.get("metrics", {}).get("CIDEr-D")
    if wanted == "top" and scores.get("decode") == "beam" and scores.get("beam_size") == width and main is not None:
        notes.append(f"{run}: its {decoding} CIDEr-D is its beam-{width} test CIDEr-D, the top beam's (its older "
                     f"diversity section holds {PRECISION_WORDS.get(made, made)}).")
        return float(main)
    held, needed = PRECISION_WORDS.get(made, made), PRECISION_WORDS.get(wanted, wanted)
    notes.append(f"{run}: {decoding} CIDEr-D {NOT_EVALUATED}: its diversity section holds {held}, not {needed} "
                 "(re-run its evaluation).")
    return None


def diversity_cells(scores: dict[str, Any] | None, decoding: str, notes: list[str]) -> list[Cell]:
    """One decoding's precision and diversity; — for a missing run, "not evaluated" for a score
    file without that part of the diversity section (never a number)."""
    section = None if scores is None else (scores.get("diversity") or {}).get(decoding) or {}
    flags = degenerate_flags(scores)
    cells: list[Cell] = []
    for _, _, key, scale, decimals in TABLE4_COLUMNS:
        value = None if section is None or key not in section else section[key]
        if value is not None and key == PRECISION_KEY:
            value = precision_of(scores or {}, decoding, notes)
        if section is None:
            cells.append(Cell(None, decimals=decimals))
        elif value is None:
            cells.append(Cell(None, missing=NOT_EVALUATED, decimals=decimals))
        else:
            cells.append(Cell(scale * value, decimals=decimals, flags=flags))
    return cells


def _settings_notes(settings: TableSettings, shown: Scores) -> tuple[dict[str, Any], list[str]]:
    """The diversity settings (params' evaluate.diversity), and a note per score file made otherwise."""
    expected = {"samples": settings.diversity.samples, "beams": settings.diversity.beams}
    notes = []
    for run, s in shown.items():
        got = (s.get("diversity") or {}).get("settings", {})
        differs = {k: got[k] for k in expected if k in got and got[k] != expected[k]}
        if differs:
            notes.append(f"{run}: diversity evaluated with " + ", ".join(f"{k} = {v}" for k, v in differs.items())
                         + " (params: " + ", ".join(f"{k} = {expected[k]}" for k in differs) + ").")
    return expected, notes


@register_table("sle_table4")
def sle_table4(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """SLE Table 4: precision and diversity of XE, SLL, SLL-ME, SLL-SLE under rs and bs."""
    models = sle_models(params, dataset)
    shown = shown_scores(params, dataset, scores, models, TABLE4_KINDS)
    settings = TableSettings.from_params(params)
    expected, settings_notes = _settings_notes(settings, shown)
    samples, beams = expected["samples"], expected["beams"]
    table = Table("sle_table4", f"{dataset} {settings.split} split: {paper.PAPER} Table 4, precision "
                  f"and diversity of the captions per image (rs: {samples} random samples, bs: top {beams} beams)",
                  [column for column, *_ in TABLE4_COLUMNS])
    home = dataset == PAPER_DATASETS["sle_table4"]
    not_trained: list[str] = []
    precision_notes: list[str] = []
    for model in models:
        numbers = home and not has_attention(params, model)
        for decoding in DECODINGS:
            for kind in TABLE4_KINDS:
                rows = kind_rows(params, dataset, scores, model, kind, f"{kind_label(params, model, kind)}, {decoding}",
                                 lambda s, d=decoding: diversity_cells(s, d, precision_notes), not_trained)
                table.rows += with_numbers(rows, paper.TABLE4[kind, decoding] if numbers else None, TABLE4_KEYS)
    if home:
        table.rows += [(f"{label} [paper]", [Cell(None, row.get(key), decimals=decimals)
                                             for _, key, _, _, decimals in TABLE4_COLUMNS])
                       for label, row in paper.TABLE4_REFERENCE]
    table.notes = [f"CIDEr-D in % (official implementation): rs = the mean over an image's {samples} samples (paper "
                   f"sec. 5.4), bs = the top beam's (the paper's bs CIDEr equal its Table 2, beam 5: the run's "
                   f"test CIDEr-D where it is decoded by beam {beams}); Div-1, Div-2 "
                   f"(higher = more diverse) and mBLEU-4 (lower = more diverse) as fractions; Self-CIDEr (Wang & "
                   f"Chan, CVPR 2019, as self-critical.pytorch's eval_multi reports it; 0 to 1, higher = more "
                   f"diverse; not in the paper); rs = "
                   f"{DECODINGS['rs']}, bs = {DECODINGS['bs']}. — = missing run; {NOT_EVALUATED} = a score file "
                   "without the diversity section (evaluated before it existed). * = a model with attention.",
                   KIND_NOTE, _paper_note("sle_table4", dataset, 4, "MSCOCO Karpathy test, no attention")]
    if home:
        table.notes.append("The paper's Table 4 is its model without attention (its bs CIDEr equal Table 2's "
                           "SLL rows without *): rows of models with attention carry no paper numbers.")
    if not models:
        table.notes.append(f"No sll / sll_sle run trains on {dataset}.")
    table.notes += settings_notes + list(dict.fromkeys(precision_notes + not_trained))  # one per run
    return table


# ---------------------------------------------------------------- Fig. 2 / Fig. 4


def _examples(scores: dict[str, Any] | None) -> dict[int, dict[str, Any]] | None:
    """A score file's diversity examples by image id; None without them."""
    examples = ((scores or {}).get("diversity") or {}).get("examples")
    return None if not examples else {ex["image_id"]: ex for ex in examples}


def _sample_runs(params: dict[str, Any], dataset: str, model: str, notes: list[str]) -> dict[str, RunSpec | None]:
    """The run each column shows for the model: the kind's first run (params order)."""
    chosen = {}
    for kind in SAMPLE_KINDS:
        views = kind_runs(params, dataset, model, kind)
        chosen[kind] = views[0] if views else None
        if len(views) > 1:
            notes.append(f"{model} {ROW_KINDS[kind].label}: showing {views[0].name}, not "
                         f"{', '.join(v.name for v in views[1:])}.")
    return chosen


@register_table("sle_samples")
def sle_samples(params: dict[str, Any], dataset: str, scores: Scores) -> Table:
    """SLE Fig. 2 / 4: the random samples of XE, SLL and SLL-SLE side by side, per test image."""
    columns = [ROW_KINDS[k].label for k in SAMPLE_KINDS] + ["references"]
    table = Table("sle_samples", f"{dataset} {TableSettings.from_params(params).split} split: {paper.PAPER} Fig. 2 / Fig. 4, "
                  "captions randomly sampled per image", columns)
    notes: list[str] = []
    models = sle_models(params, dataset)
    runs = {m: _sample_runs(params, dataset, m, notes) for m in models}
    examples = {v.name: _examples(scores.get(v.name)) for m in models for v in runs[m].values() if v}
    source = next((name for name, ex in examples.items() if ex), None)
    ids = list(examples[source]) if source else []
    for model in models:
        found = {k: (examples.get(v.name) if v else None) for k, v in runs[model].items()}
        why = {k: NOT_EVALUATED if v and v.name in scores else MISSING for k, v in runs[model].items()}
        if not any(found.values()) or not ids:
            table.rows.append((f"{model}: no examples", [text_cell(why[k]) for k in SAMPLE_KINDS] + [text_cell(None)]))
            continue
        for image_id in ids:
            per_kind = {k: (ex or {}).get(image_id) for k, ex in found.items()}
            for kind, ex in found.items():
                if ex and image_id not in ex:
                    notes.append(f"{runs[model][kind].name}: no example for image {image_id}.")
            refs = next((e["references"] for e in per_kind.values() if e), [])
            lines = max([len(refs)] + [len(e["rs"]) for e in per_kind.values() if e])
            for i in range(lines):
                cells = []
                for kind in SAMPLE_KINDS:
                    e = per_kind[kind]
                    if e is None:
                        cells.append(text_cell(why[kind] if not found[kind] else MISSING))
                    else:
                        cells.append(text_cell(e["rs"][i] if i < len(e["rs"]) else ""))
                cells.append(text_cell(refs[i] if i < len(refs) else ""))
                table.rows.append((f"{model}, image {image_id}, {i + 1}", cells))
    shown = "; ".join(f"{model}: " + ", ".join(f"{ROW_KINDS[k].label} = {v.name if v else 'no run'}"
                                               for k, v in runs[model].items()) for model in models)
    table.notes = ["Captions randomly sampled (rs) from each model for the same test images (ids from "
                   f"{source or 'no run'}), as the paper's Fig. 2 / Fig. 4; references = the image's human captions. "
                   f"{MISSING} = missing run or image; {NOT_EVALUATED} = a score file without diversity examples."]
    table.notes += [f"Columns: {shown}." if models else f"No sll / sll_sle run trains on {dataset}."] + notes
    return table
