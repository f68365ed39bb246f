"""`caprl curves`: learning curves (PNG + CSV per run, an overview PNG) from generated history files."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from caprl import cli
from caprl.errors import CaprlError
from caprl.figures import curves

DATASET = "shapes"


def history(run: str, epochs: int, val: dict[str, float] | None = None, nan_epoch: int | None = None,
            start: float | None = None) -> dict[str, Any]:
    """A history as `caprl train` writes it; ``val``: metric -> first value (grows by 0.01 per epoch);
    ``start``: a run with an init, its epoch 0 (the starting weights) scoring ``start`` on every metric."""
    records = []
    if start is not None:
        records.append({"epoch": 0, "step": 0, "train_loss": None, "step_losses": [], "start": True, "seconds": 0.5,
                        **{f"val_{k}": start for k in (val or {})}})
    for e in range(1, epochs + 1):
        loss = float("nan") if e == nan_epoch else 3.0 / e + 0.001 * e
        records.append({"epoch": e, "step": 4 * e, "train_loss": loss, "lr": 1e-3, "step_losses": [loss] * 4,
                        "seconds": 0.5, **{f"val_{k}": v + 0.01 * e for k, v in (val or {}).items()}})
    scores = [r.get("val_CIDEr-D", 0.0) for r in records]
    return {"run": run, "best_epoch": records[scores.index(max(scores))]["epoch"], "epochs": records}


HISTORIES = {
    "fc-xe": history("fc-xe", 6, {"CIDEr-D": 0.3}),
    "fc-scst": history("fc-scst", 3, {"CIDEr-D": 0.5}, nan_epoch=2, start=0.6),  # every epoch worse than its start
    "fc-luo2018-lam0_5": history("fc-luo2018-lam0_5", 2, {"CIDEr-D": 0.4, "R@1": 0.1, "R@5": 0.3, "R@10": 0.5}),
    "listener": history("listener", 4, {"R@1": 0.2, "R@5": 0.5, "R@10": 0.7}),
    "fc-value": history("fc-value", 3, {"value_mse": 0.9, "neg_value_mse": -0.9}, start=1.2),
}


def write_histories(root: Path) -> list[Path]:
    paths = []
    for run, hist in HISTORIES.items():
        path = root / "runs" / DATASET / run / "history.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(hist))  # NaN as json.dumps writes it (the trainer's writer)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`caprl curves` run on the histories above, with absolute paths."""
    root = tmp_path_factory.mktemp("curves")
    paths = write_histories(root)
    argv = ["curves", "--dataset", DATASET, "--out-dir", str(root / "out" / "curves"),
            "--overview", str(root / "out" / "overview.png"), "--history", *map(str, paths)]
    assert cli.main(argv) == 0
    return root


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def test_one_png_and_csv_per_run_and_the_overview(drawn: Path) -> None:
    out = drawn / "out"
    assert sorted(p.name for p in (out / "curves").iterdir()) == sorted(f"{r}.{e}" for r in HISTORIES for e in ("png", "csv"))
    for png in [*(out / "curves").glob("*.png"), out / "overview.png"]:
        rgb = pixels(png)
        assert rgb.shape[0] > 200 and rgb.shape[1] > 500, png.name
        assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20, f"{png.name} is nearly one colour"
    assert not list(out.rglob(".*.tmp")), "atomic writes leave no temporary file"


def test_csv_holds_the_history_values_exactly(drawn: Path) -> None:
    for run, hist in HISTORIES.items():
        with open(drawn / "out" / "curves" / f"{run}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert list(rows[0]) == list(curves.CSV_COLUMNS)
        assert [int(r["epoch"]) for r in rows] == [e["epoch"] for e in hist["epochs"]]
        assert {r["dataset"] for r in rows} == {DATASET} and {r["run"] for r in rows} == {run}
        for row, record in zip(rows, hist["epochs"]):
            loss, cider = record["train_loss"], record.get("val_CIDEr-D")
            assert row["train_loss"] == ("" if loss is None or math.isnan(loss) else repr(loss))
            assert row["val_cider"] == ("" if cider is None else repr(cider))
            if cider is not None:
                assert float(row["val_cider"]) == cider


def test_runs_without_cider_plot_their_own_metrics() -> None:
    listener = curves.curve_of(HISTORIES["listener"])
    assert not listener.has_cider and list(listener.other) == ["R@1", "R@5", "R@10"]
    value = curves.curve_of(HISTORIES["fc-value"])
    assert list(value.other) == ["value_mse"]  # its negated copy is left out
    fig = curves.run_figure(DATASET, listener)
    val_ax = fig.axes[1]
    assert [line.get_label() for line in val_ax.lines] == ["R@1", "R@5", "R@10"]
    assert "R@10" in val_ax.get_title() and "CIDEr-D" not in val_ax.get_ylabel()
    captioner = curves.run_figure(DATASET, curves.curve_of(HISTORIES["fc-scst"]))
    loss_line = captioner.axes[0].lines[0]
    assert list(loss_line.get_xdata()) == [1, 3]  # the NaN epoch (no steps) is not drawn
    assert captioner.axes[1].get_ylabel() == "CIDEr-D"


def test_the_start_is_a_point_of_the_validation_panel_only() -> None:
    """Epoch 0 (an init run's starting weights): a "start" marker and the first point of the
    validation curve, no training loss; the star on the selected epoch, here the start; the
    CSV's epoch-0 row has an empty train_loss."""
    curve = curves.curve_of(HISTORIES["fc-scst"])
    assert curve.has_start and curve.best_epoch == 0 and curve.train_loss[0] is None
    loss_ax, val_ax = curves.run_figure(DATASET, curve).axes
    assert list(loss_ax.lines[0].get_xdata()) == [1, 3]
    assert list(val_ax.lines[0].get_xdata()) == [0, 1, 2, 3]
    labels = [line.get_label() for line in val_ax.lines]
    assert labels[1:] == ["start: 0.600", "best: start, 0.600"]
    assert [text.get_text() for text in val_ax.get_legend().get_texts()] == labels[1:]
    assert list(val_ax.lines[2].get_xdata()) == [0]  # the star
    rows = list(csv.DictReader(io.StringIO(curves.csv_text(DATASET, curve))))
    assert (rows[0]["epoch"], rows[0]["train_loss"], rows[0]["val_cider"]) == ("0", "", "0.6")
    value = curves.run_figure(DATASET, curves.curve_of(HISTORIES["fc-value"])).axes[1]
    assert [line.get_label() for line in value.lines] == ["value_mse", "start"]
    assert list(value.lines[0].get_xdata()) == [0, 1, 2, 3]
    later = curves.curve_of(HISTORIES["fc-xe"])  # no start: the star on its best epoch
    assert not later.has_start and later.best_epoch == 6
    assert curves.run_figure(DATASET, later).axes[1].lines[-1].get_label() == "best: epoch 6, 0.360"


def test_overview_has_one_line_per_captioning_run() -> None:
    fig = curves.overview_figure(DATASET, [curves.curve_of(h) for h in HISTORIES.values()])
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert labels == ["fc-xe", "fc-scst", "fc-luo2018-lam0_5"]
    empty = curves.overview_figure(DATASET, [curves.curve_of(HISTORIES["listener"])])
    assert "no run" in empty.axes[0].texts[0].get_text()


def test_no_absolute_path_and_the_same_bytes_every_time(drawn: Path, tmp_path: Path) -> None:
    root = str(drawn).encode()
    for path in (drawn / "out").rglob("*.*"):
        data = path.read_bytes()
        assert root not in data and b"/tmp" not in data, path.name
        assert b"Software" not in data and b"Matplotlib" not in data, path.name
    again = tmp_path / "again"
    paths = curves.draw(DATASET, [curves.curve_of(h) for h in HISTORIES.values()], again, tmp_path / "ov.png")
    assert {p.name for p in paths} == {p.name for p in (drawn / "out" / "curves").iterdir()} | {"ov.png"}
    for p in paths[:-1]:
        assert p.read_bytes() == (drawn / "out" / "curves" / p.name).read_bytes(), p.name
    assert paths[-1].read_bytes() == (drawn / "out" / "overview.png").read_bytes()


def test_a_reused_figure_draws_what_a_new_one_does() -> None:
    """draw() redraws one figure run after run: no trace of the previous run may remain."""
    def png(fig: Any) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=curves.DPI, metadata=curves.PNG_METADATA)
        return buf.getvalue()

    order = [curves.curve_of(HISTORIES[r]) for r in ("fc-xe", "listener", "fc-scst", "fc-value")]
    order.append(curves.Curve(run="no-epochs"))
    figure = curves.RunFigure()
    for c in order:
        assert png(figure.update(DATASET, c)) == png(curves.run_figure(DATASET, c)), c.run


def test_bad_history_is_an_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "runs" / "x" / "history.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"epochs": []}))
    with pytest.raises(CaprlError, match="history.json: not a training history"):
        curves.read_curve(bad)
    bad.write_text(json.dumps({"run": "x", "epochs": [{"train_loss": 1.0}]}))
    with pytest.raises(CaprlError, match="integer 'epoch'"):
        curves.read_curve(bad)
    twice = [curves.curve_of(HISTORIES["fc-xe"])] * 2
    with pytest.raises(CaprlError, match="two histories of the same run"):
        curves.draw(DATASET, twice, tmp_path / "o", tmp_path / "o.png")


def test_plan_lists_every_curve_file() -> None:
    from caprl.workflow import plan as wp
    from conftest import default_params

    plan = wp.build_plan(default_params())
    files = plan.curve_files("synthetic")
    runs = [job.run for job in plan.trained("synthetic")]
    assert "listener" in runs and "fc-value" in runs  # pre-training runs have curves too
    assert files[-1] == "results/figures/synthetic/curves_val_cider.png"
    assert files[:-1] == [f"results/figures/synthetic/curves/{run}.{ext}" for run in runs for ext in ("png", "csv")]
