"""``caprl psst-figures``: paper 004's Figs. 3 and 4 from the runs' score and retrieval files.

* ``psst_fig3.png`` (Fig. 3): one panel per language metric (BLEU-4, CIDEr-D, METEOR, ROUGE-L,
  SPICE); x = the metric, y = the listener's R@10 (%); one line with markers per method,
  through its runs in ascending λ (PSST: ρ = ``discriminative.table_rho``); frozen-speaker
  runs as single markers. A metric no score file has says why in its panel.
* ``psst_fig4.png`` (Fig. 4): R@10 (%) at a fixed CIDEr-D (``discriminative.operating_points.
  <dataset>.rho_cider``; auto: the highest CIDEr-D every ρ curve reaches) against ρ, one line
  per PSST method. Where no PSST run has ρ = 0, the matching ST method's curve stands for it
  (ST = PSST with ρ = 0: the same objective). Read as the table ``psst_rho`` reads it
  (:func:`caprl.tables.operating.rho_reading`): ``auto`` is chosen on the validation curves
  (each score file's ``validation``, :mod:`caprl.evaluation.validation`) and the test R@10 read
  where each validation curve reaches it; on the test curves only for score files without
  validation numbers (the title says which).

Runs come from params.yaml by method and options (:mod:`caprl.tables.operating`); numbers from
``<results-dir>/<run>/scores.json`` and ``retrieval.json``. Drawn on matplotlib's Agg canvas,
each PNG written atomically.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from caprl import params as params_mod
from caprl.io import atomic_path
from caprl.tables.build import Scores, load_scores, portable
from caprl.tables.operating import (FROZEN, FROZEN_LABELS, METHOD_LABELS, PSST_METHODS, VAL, Point,
                                    curve, family_points, family_runs, interpolate, method_points, models_of,
                                    rho_reading, table_rho)
from caprl.tables.psst_numbers import OPERATING_POINTS

log = logging.getLogger(__name__)

FIG3, FIG4 = "psst_fig3.png", "psst_fig4.png"
FIG3_PANELS = ["BLEU-4", "CIDEr-D", "METEOR", "ROUGE-L", "SPICE"]  # the paper's panel order
STYLES: dict[str, tuple[str, str]] = {  # method -> (colour, marker)
    "luo2018": ("tab:red", "o"), "reinforce_joint": ("tab:orange", "s"), "st_gumbel": ("tab:green", "^"),
    "st_multinomial": ("tab:purple", "v"), "psst_gumbel": ("tab:cyan", "D"), "psst_multinomial": ("tab:blue", "o"),
}
FROZEN_STYLES: dict[str, tuple[str, str]] = {"luo2018": ("darkred", "*"), "xe": ("black", "X")}
REASON_CHARS = 60
DPI = 100


def short(reason: str, limit: int = REASON_CHARS) -> str:
    reason = portable(reason).strip()
    return reason if len(reason) <= limit else reason[: limit - 1].rstrip() + "…"


def not_computed(metric: str, scores: Scores, points: list[Point]) -> str | None:
    """Why no run has ``metric`` ("SPICE not computed: java not found"), None if some run has it."""
    if any(metric in p.values for p in points):
        return None
    reasons = [s.get("unavailable", {}).get(metric) for s in scores.values()]
    reason = next((r for r in reasons if r), None)
    return f"{metric} not computed: {short(reason) if reason else 'not in the score files'}"


def _label(label: str, model: str, models: list[str]) -> str:
    return label if len(models) <= 1 else f"{label} [{model}]"


def fig3(params: dict[str, Any], dataset: str, scores: Scores) -> Figure:
    """Paper 004 Fig. 3: R@10 against each language metric, one line per method."""
    points = family_points(params, dataset, scores)
    done = [p for p in points if p.complete]
    rho, models = table_rho(params), models_of(params, points)
    fig = Figure(figsize=(4.0 * len(FIG3_PANELS), 5.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(FIG3_PANELS), squeeze=False)[0]
    for ax, metric in zip(axes, FIG3_PANELS):
        why = not_computed(metric, scores, done) if done else "no run with scores and retrieval results"
        if why:
            ax.text(0.5, 0.5, textwrap.fill(why, 28), ha="center", va="center", fontsize=9, transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(metric)
            continue
        for model in models:
            for method, label in METHOD_LABELS.items():
                runs = method_points(done, method, rho if method in PSST_METHODS else None, model)
                line = curve(runs, metric, "R@10")
                if line:
                    colour, marker = STYLES[method]
                    ax.plot([x for x, _ in line], [100 * y for _, y in line], marker=marker, color=colour,
                            label=_label(label, model, models))
            for p in (p for p in done if p.method == FROZEN and p.spec.model == model and metric in p.values):
                colour, marker = FROZEN_STYLES.get(p.init_method or "", ("grey", "P"))
                name = FROZEN_LABELS.get(p.init_method or "", f"Frozen Speaker ({p.init_method})")
                ax.plot([p.values[metric]], [100 * p.values["R@10"]], linestyle="none", marker=marker, markersize=11,
                        color=colour, label=_label(name, model, models))
        ax.relim()
        ax.autoscale_view()
        ax.margins(0.08)
        ax.set_xlabel(metric)
        ax.set_ylabel("R@10 (%)")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=9)
    fig.suptitle(f"{dataset}, {params['evaluate']['split']} split: discriminability (listener R@10) vs naturalness, "
                 f"one point per λ (PSST: ρ = {rho:g}) — paper 004 Fig. 3", fontsize=11)
    fig.tight_layout(rect=(0, 0.12 if handles else 0, 1, 0.93))
    return fig


def fig4(params: dict[str, Any], dataset: str, scores: Scores) -> Figure:
    """Paper 004 Fig. 4: R@10 at a fixed CIDEr-D against ρ, one line per PSST method (the operating
    point and the curves of :func:`caprl.tables.operating.rho_reading`, as the table psst_rho's)."""
    points = family_points(params, dataset, scores)
    models = models_of(params, [p for p in points if p.complete]) or [None]
    curves, op = rho_reading(params, dataset, points, models, OPERATING_POINTS.get(dataset, {}).get("rho_cider"))
    fig = Figure(figsize=(7.2, 5.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    borrowed = []
    for (method, model), (per_rho, from_st) in curves.items():
        xy = [(rho, interpolate(c, op.value)) for rho, c in per_rho.items()] if op.value is not None else []
        xy = [(rho, 100 * y) for rho, y in xy if y is not None]
        if xy:
            colour, marker = STYLES[method]
            ax.plot(*zip(*xy), marker=marker, color=colour, label=_label(METHOD_LABELS[method], model or "", models))
            if from_st:
                borrowed.append(METHOD_LABELS[PSST_METHODS[method]])
    if not ax.lines:
        any_curve = any(c for per_rho, _ in curves.values() for c in per_rho.values())
        why = ("no PSST / ST run with scores and retrieval results" if not any_curve
               else "the ρ curves' CIDEr-D ranges do not overlap" if op.value is None
               else "no curve reaches this CIDEr-D")
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=9)
    ax.set_xlabel("ρ (partial-sampling rate)")
    ax.set_ylabel("R@10 (%)")
    ax.grid(alpha=0.3)
    cider = "none" if op.value is None else f"{op.value:.3g}"
    same = op.paper is not None and op.value is not None and abs(op.paper - op.value) < 1e-9
    how = ("the paper's value" if same else "params.yaml") if not op.auto else (
        "auto, on validation: the highest val CIDEr-D every ρ curve reaches;\ntest R@10 read where each validation "
        "curve reaches it" if op.split == VAL else "auto: the highest every ρ curve reaches")
    ax.set_title(f"{dataset}: R@10 at a fixed CIDEr-D vs ρ (paper 004 Fig. 4)\nCIDEr-D = {cider} ({how})",
                 fontsize=10)
    if borrowed:
        fig.text(0.5, 0.01, f"ρ = 0: the {' / '.join(dict.fromkeys(borrowed))} runs (ST = PSST with ρ = 0)",
                 ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if borrowed else 0, 1, 1))
    return fig


def write_png(fig: Figure, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)


def draw(params: dict[str, Any], dataset: str, scores: Scores, out_dir: Path) -> list[Path]:
    """Write both figures into ``out_dir``; returns their paths."""
    paths = [out_dir / FIG3, out_dir / FIG4]
    for build, path in zip((fig3, fig4), paths):
        write_png(build(params, dataset, scores), path)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--results-dir", required=True,
                        help="results/<dataset>: <run>/scores.json and <run>/retrieval.json of every run")
    parser.add_argument("--out-dir", required=True, help=f"writes {FIG3} and {FIG4} here")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    dataset = params_mod.dataset_spec(params, args.dataset)["name"]
    runs = [spec.name for spec in family_runs(params, dataset)]
    scores = load_scores(Path(args.results_dir), runs, dataset)
    for path in draw(params, dataset, scores, Path(args.out_dir)):
        log.info("figure written to %s", path)
