"""``caprl curves``: learning curves of every trained run of a dataset, from their history files.

Reads ``runs/<dataset>/<run>/history.json`` (written by ``caprl train``, see
:func:`caprl.training.run.history_json`: ``{"run": name, "best_epoch": e, "epochs": [{"epoch",
"step", "train_loss", "step_losses", "seconds", "val_<metric>", ...}]}``) and writes, in one process:

* ``<out-dir>/<run>.png``: two panels, the mean training loss per epoch and the validation
  CIDEr-D per epoch (greedy captions, the epoch selection metric of captioning methods). Runs
  that train no caption model (listener, value network) have no CIDEr-D: their panel shows the
  validation metrics they have (a listener's recall, a value network's MSE). A run that starts
  from an init has an epoch 0 (its starting weights, validated before any step): a square
  marker labelled "start" on the validation panel, no point on the loss panel (no step). The
  star marks the selected epoch (the history's ``best_epoch``; the highest CIDEr-D in a history
  without it), which may be the start.
* ``<out-dir>/<run>.csv``: the plotted series, one row per epoch (epoch 0 included, its
  train_loss empty), columns ``dataset, run, epoch, train_loss, val_cider`` (empty where the run
  has no such value); the numbers are the history's, written with ``repr`` so they read back exactly.
* ``--overview`` PNG: validation CIDEr-D per epoch, one line per run that has it.

No path is written into the figures or the CSV (titles name the dataset and the run). PNGs
are drawn on matplotlib's Agg canvas without a ``Software`` entry, so the same histories give
the same bytes; every file is written atomically.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from caprl.errors import CaprlError
from caprl.io import atomic_path, read_json, write_text

log = logging.getLogger(__name__)

CIDER = "val_CIDEr-D"  # the trainer's key for the validation CIDEr-D of captioning methods
CSV_COLUMNS = ("dataset", "run", "epoch", "train_loss", "val_cider")
DPI = 80  # per-run figures: 720 x 272 pixels
OVERVIEW_DPI = 100
PNG_METADATA: dict[str, Any] = {"Software": None}  # no matplotlib version in the bytes
LINESTYLES = ("-", "--", ":", "-.")
LEGEND_ROWS = 24  # overview legend entries per column


@dataclass
class Curve:
    """One run's per-epoch series (None: no value that epoch)."""

    run: str
    epochs: list[int] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)
    val_cider: list[float | None] = field(default_factory=list)
    other: dict[str, list[float | None]] = field(default_factory=dict)  # other val_* metrics, by name
    best_epoch: int | None = None  # the selected epoch (0: the start), where the history says

    @property
    def has_cider(self) -> bool:
        return any(v is not None for v in self.val_cider)

    @property
    def has_start(self) -> bool:
        """True if the run's epoch 0 (its starting weights) was validated."""
        return 0 in self.epochs


def _number(value: Any) -> float | None:
    """A finite float, or None (missing, NaN: an epoch without steps)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def curve_of(history: dict[str, Any], where: str = "history") -> Curve:
    """The series of a parsed history file; CaprlError naming ``where`` if it is not one."""
    if not isinstance(history, dict) or not isinstance(history.get("run"), str) \
            or not isinstance(history.get("epochs"), list):
        raise CaprlError(f"{where}: not a training history (expected {{'run': name, 'epochs': [...]}})")
    records = history["epochs"]
    if not all(isinstance(r, dict) and isinstance(r.get("epoch"), int) for r in records):
        raise CaprlError(f"{where}: every entry of 'epochs' needs an integer 'epoch'")
    metrics = [k for r in records for k in r if k.startswith("val_") and k != CIDER]
    names = [k for k in dict.fromkeys(metrics) if not (k.startswith("val_neg_") and f"val_{k[8:]}" in metrics)]
    best = history.get("best_epoch")
    return Curve(run=history["run"], epochs=[r["epoch"] for r in records],
                 train_loss=[_number(r.get("train_loss")) for r in records],
                 val_cider=[_number(r.get(CIDER)) for r in records],
                 other={k[4:]: [_number(r.get(k)) for r in records] for k in names},
                 best_epoch=best if isinstance(best, int) and not isinstance(best, bool) else None)


def read_curve(path: Path) -> Curve:
    return curve_of(read_json(path, "training history"), where=str(path))


def csv_text(dataset: str, curve: Curve) -> str:
    """The CSV of one run (``CSV_COLUMNS``), values exactly the history's."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for epoch, loss, cider in zip(curve.epochs, curve.train_loss, curve.val_cider):
        writer.writerow([dataset, curve.run, epoch, "" if loss is None else repr(loss),
                         "" if cider is None else repr(cider)])
    return buf.getvalue()


def _xy(epochs: list[int], values: list[float | None]) -> tuple[list[int], list[float]]:
    pairs = [(e, v) for e, v in zip(epochs, values) if v is not None]
    return [e for e, _ in pairs], [v for _, v in pairs]


def _mark_start(ax: Any, x: list[int], y: list[float], color: str, label: str) -> None:
    """The starting weights' point (epoch 0, if the series has one): a hollow square."""
    if x and x[0] == 0:
        ax.plot([0], [y[0]], color=color, marker="s", markersize=7, markerfacecolor="none", linestyle="none",
                label=label)  # an explicit colour: the next series keeps its place in the colour cycle


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, transform=ax.transAxes)


def _style(ax: Any, title: str, ylabel: str, title_size: float = 9) -> None:
    """Title, labels, grid and integer epoch ticks, all at fixed positions: drawing then
    needs no layout pass over the tick labels (most of the time of a small figure)."""
    ax.set_title(title, fontsize=title_size, y=1.0, pad=4)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_label_coords(0.5, -0.13)
    ax.yaxis.set_label_coords(-0.11, 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.grid(alpha=0.3)


class RunFigure:
    """The two-panel figure of one run, redrawn for run after run: its axes and their ticks
    are made once (making ticks is a third of the time of drawing a small figure)."""

    def __init__(self) -> None:
        self.fig = Figure(figsize=(9.0, 3.4))
        FigureCanvasAgg(self.fig)
        self.loss_ax, self.val_ax = self.fig.subplots(1, 2)
        self.fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.84, wspace=0.25)  # fixed: no layout pass
        self.title = self.fig.suptitle("", fontsize=11)

    def _clear(self) -> None:
        for ax in (self.loss_ax, self.val_ax):
            for artist in [*ax.lines, *ax.texts]:
                artist.remove()
            if ax.get_legend() is not None:
                ax.get_legend().remove()
            ax.set_prop_cycle(None)
            ax.set_autoscale_on(True)

    def update(self, dataset: str, curve: Curve) -> Figure:
        """Mean training loss per epoch; validation CIDEr-D (or the run's own metrics)."""
        self._clear()
        loss_ax, val_ax = self.loss_ax, self.val_ax
        x, y = _xy(curve.epochs, curve.train_loss)
        if x:
            loss_ax.plot(x, y, marker="o", markersize=3, color="tab:blue")
        else:
            _empty(loss_ax, "no training loss recorded")
        _style(loss_ax, "training loss (mean over the epoch's steps)", "loss")
        if curve.has_cider:
            x, y = _xy(curve.epochs, curve.val_cider)
            val_ax.plot(x, y, marker="o", markersize=3, color="tab:red")
            if x[0] == 0:
                _mark_start(val_ax, x, y, "black", f"start: {y[0]:.3f}")
            best = x.index(curve.best_epoch) if curve.best_epoch in x else max(range(len(y)), key=y.__getitem__)
            what = "start" if x[best] == 0 else f"epoch {x[best]}"
            val_ax.plot([x[best]], [y[best]], marker="*", markersize=12, color="gold", markeredgecolor="black",
                        linestyle="none", label=f"best: {what}, {y[best]:.3f}")
            val_ax.legend(fontsize=8, loc="lower right")
            _style(val_ax, "validation CIDEr-D (greedy captions)", "CIDEr-D")
        else:
            drawn = [name for name, values in curve.other.items() if _xy(curve.epochs, values)[0]]
            for i, name in enumerate(drawn):
                x, y = _xy(curve.epochs, curve.other[name])
                line, = val_ax.plot(x, y, marker="o", markersize=3, label=name)
                _mark_start(val_ax, x, y, line.get_color(), "start" if i == 0 else "_nolegend_")
            if drawn:
                val_ax.legend(fontsize=8)
            else:
                _empty(val_ax, "no validation metric recorded")
            what = ", ".join(drawn) if drawn else "metrics: none"
            _style(val_ax, f"validation {what} (no CIDEr-D: not a captioner)", "value")
        for ax in (loss_ax, val_ax):  # the limits a new figure would have
            ax.relim()
            if ax.lines:
                ax.autoscale_view()
            else:
                ax.set(xlim=(0, 1), ylim=(0, 1))
        self.title.set_text(f"{dataset}: {curve.run}")
        return self.fig


def run_figure(dataset: str, curve: Curve) -> Figure:
    """The two-panel figure of one run (a new figure; :func:`draw` reuses one for every run)."""
    return RunFigure().update(dataset, curve)


def overview_figure(dataset: str, curves: list[Curve]) -> Figure:
    """Validation CIDEr-D per epoch, one line per run that has it; the legend beside the axes."""
    shown = [c for c in curves if c.has_cider]
    ncol = max(1, math.ceil(len(shown) / LEGEND_ROWS))
    fig = Figure(figsize=(8.0 + 2.4 * ncol, 6.0))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    palette = [f"C{i}" for i in range(10)]
    for i, c in enumerate(shown):
        ax.plot(*_xy(c.epochs, c.val_cider), color=palette[i % len(palette)],
                linestyle=LINESTYLES[(i // len(palette)) % len(LINESTYLES)], marker="o", markersize=3, label=c.run)
    if shown:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=ncol, frameon=False)
    else:
        _empty(ax, "no run with a validation CIDEr-D")
    _style(ax, f"{dataset}: validation CIDEr-D per epoch, {len(shown)} captioning runs", "CIDEr-D", title_size=11)
    ax.set_xlabel("epoch (of each run; epoch 0: a run's starting weights, e.g. an RL run's XE model)")
    ax.xaxis.set_label_coords(0.5, -0.07)
    ax.yaxis.set_label_coords(-0.08, 0.5)
    width = fig.get_figwidth()
    fig.subplots_adjust(left=0.8 / width, right=(width - 2.4 * ncol - 0.1) / width, bottom=0.1, top=0.93)
    return fig


def write_png(fig: Figure, path: Path, dpi: int = DPI) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, metadata=PNG_METADATA)


def draw(dataset: str, curves: list[Curve], out_dir: Path, overview: Path) -> list[Path]:
    """Write ``<run>.png`` and ``<run>.csv`` per curve into ``out_dir``, and the overview PNG."""
    runs = [c.run for c in curves]
    if len(set(runs)) != len(runs):
        raise CaprlError(f"two histories of the same run: {sorted(r for r in set(runs) if runs.count(r) > 1)}")
    paths, figure = [], RunFigure()
    for c in curves:
        write_png(figure.update(dataset, c), out_dir / f"{c.run}.png")
        write_text(out_dir / f"{c.run}.csv", csv_text(dataset, c))
        paths += [out_dir / f"{c.run}.png", out_dir / f"{c.run}.csv"]
    write_png(overview_figure(dataset, curves), overview, OVERVIEW_DPI)
    return [*paths, overview]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name (titles and the CSV's dataset column)")
    parser.add_argument("--out-dir", required=True, help="writes <run>.png and <run>.csv here, per history")
    parser.add_argument("--overview", required=True, help="output: validation CIDEr-D of every run (PNG)")
    parser.add_argument("--history", nargs="+", required=True, metavar="HISTORY",
                        help="the runs' history.json files (caprl train --history)")


def main(args: argparse.Namespace) -> None:
    curves = [read_curve(Path(path)) for path in args.history]
    paths = draw(args.dataset, curves, Path(args.out_dir), Path(args.overview))
    log.info("%d curve files of %d runs written to %s and %s", len(paths), len(curves), args.out_dir, args.overview)
