"""Paper 004's ``auto`` operating points are chosen on validation and read on test, in the pipeline.

``caprl evaluate`` writes into each score file the validation numbers of the epoch its checkpoint
holds, read from the checkpoint (:mod:`caprl.evaluation.validation`); ``caprl tables`` (the tables
rule) chooses the operating point on those validation curves and reads the test curves there.
Until the score files carried them, only the claims script (now :mod:`caprl.claims`) attached validation numbers, and
the tables the workflow built read their ``auto`` points on the test curves.
"""

from __future__ import annotations

import copy
import csv
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from caprl import io, params as params_mod
from caprl.errors import CaprlError
from caprl.evaluation import validation
from caprl.models import checkpoint
from caprl.tables.operating import METHOD_LABELS, PSST_METHODS, family_runs, table_rho
from conftest import default_params
from pipeline_data import DatasetPaths, caprl_command
from stage_inputs import degenerate_checkpoint, user_error

DATASET = "synthetic"
# Every method's two runs (λ low, λ high), as (test CIDEr-D, test R@10): the test curves overlap up to
# CIDEr-D 1.30 (every curve's highest), where each reads R@10 40%.
TEST_POINTS = [(1.30, 0.40), (1.00, 0.70)]
VAL_SHIFT = -0.10  # validation CIDEr-D of every run: its test CIDEr-D - 0.1 ...
LOW_VAL = "luo2018"  # ... and 0.1 lower still for this method: the validation curves overlap up to 1.10


def family_reports(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Score reports, as ``caprl evaluate`` writes them, of every run of paper 004's family in the demo's
    params (its sweeps expanded, as ``caprl tables`` reads them) on the synthetic set (retrieval results
    under ``retrieval``)."""
    specs = family_runs(params_mod.resolve(copy.deepcopy(params)), DATASET)
    out = {}
    for spec in specs:
        lams = sorted({s.options["lam"] for s in specs if s.method == spec.method and "lam" in s.options})
        cider, r10 = TEST_POINTS[lams.index(spec.options["lam"])] if "lam" in spec.options else (1.15, 0.55)
        val_cider = cider + VAL_SHIFT + (VAL_SHIFT if spec.method == LOW_VAL else 0.0)
        recalls = {"R@1": r10 - 0.3, "R@5": r10 - 0.1, "R@10": r10}
        out[spec.name] = {
            "run": spec.name, "dataset": DATASET, "split": "test", "best_epoch": 2,
            "metrics": {"CIDEr-D": cider, "BLEU-4": cider / 4, "METEOR": 0.25, "ROUGE-L": 0.5, "SPICE": 0.2},
            "validation": {"epoch": 2, "metrics": {"CIDEr-D": val_cider, **recalls}},
            "retrieval": {"run": spec.name, "dataset": DATASET, "split": "test", "captions": "generated",
                          "mean_rank": 2.0, **recalls}}
    return out


def caprl_tables(workdir: Path, reports: dict[str, dict[str, Any]], tables: list[str]) -> subprocess.CompletedProcess:
    """The tables rule's command on ``reports`` written where the workflow writes them."""
    params = default_params()
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for run, report in reports.items():
        folder = workdir / "results" / DATASET / run
        folder.mkdir(parents=True, exist_ok=True)
        report = dict(report)
        (folder / "retrieval.json").write_text(json.dumps(report.pop("retrieval")))
        (folder / "scores.json").write_text(json.dumps(report))
    args = ["--dataset", DATASET, "--results-dir", "results/synthetic", "--out-dir", "results/tables"]
    return subprocess.run(caprl_command("tables", workdir / "params.yaml", *args,
                                        *[a for t in tables for a in ("--table", t)]),
                          cwd=workdir, capture_output=True, text=True, timeout=120)


def table_column(path: Path, column: str) -> dict[str, float]:
    """Row label -> our value in ``column`` of a table's CSV (rows with one)."""
    rows = list(csv.DictReader(path.read_text().splitlines()))
    return {row["approach"]: float(row[column]) for row in rows if row[column]}


def test_the_tables_step_chooses_the_operating_point_on_the_validation_curves(tmp_path: Path) -> None:
    """Test curves: x0 = 1.30, every R@10 40%. Validation curves (0.1 lower; Luo's 0.2 lower): x0 = 1.10,
    one third of the way from each run at val 1.20 to its run at val 0.90, so each method's test R@10
    is read a third of the way from 40% to 70%: 50%; Luo's val curve ends at 1.10: its top run, 40%.
    Read on the test curves (the tables before the score files carried validation numbers), every
    cell was 40% at CIDEr-D 1.30."""
    params = params_mod.resolve(default_params())
    reports = family_reports(params)
    assert {(s.method, s.options.get("rho")) for s in family_runs(params, DATASET)} >= {
        (m, table_rho(params) if m in PSST_METHODS else None) for m in METHOD_LABELS}  # every row has a curve
    assert len(reports) == len(family_runs(params, DATASET)) >= 2 * len(METHOD_LABELS)  # 2 λ per method at least
    proc = caprl_tables(tmp_path, reports, ["psst_table2", "psst_table1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "results" / "tables" / f"{DATASET}_psst_table2.md").read_text()
    assert "CIDEr-D = 1.100 (auto, chosen on validation" in md
    assert "chosen on the validation split" in md and "on the test curves" not in md
    r10 = table_column(tmp_path / "results" / "tables" / f"{DATASET}_psst_table2.csv", "R@10")
    assert r10.pop(METHOD_LABELS[LOW_VAL]) == pytest.approx(40.0)
    assert r10 and all(v == pytest.approx(50.0) for v in r10.values()), r10
    # Table 1 at a matched R@5: validation R@5 equals test R@5 here, so the validation curves' overlap is the
    # test curves' (R@5 60%), and each method's test CIDEr-D is read at its run of test R@5 60%, 1.00.
    md1 = (tmp_path / "results" / "tables" / f"{DATASET}_psst_table1.md").read_text()
    assert "R@5 = 60.0% (auto, chosen on validation" in md1 and "on the test curves" not in md1


def test_the_tables_step_refuses_validation_numbers_of_other_weights(tmp_path: Path) -> None:
    """A score file whose validation section is of another epoch than its checkpoint's (best_epoch) is
    refused, the run's score file named: its two curves would be of different weights."""
    reports = family_reports(default_params())
    run = next(iter(reports))
    reports[run] = {**reports[run], "best_epoch": 3}
    proc = caprl_tables(tmp_path, reports, ["psst_table2"])
    error = user_error(proc, "tables")
    assert f"scores.json of run {run} on {DATASET}" in error and "epoch 2" in error and "epoch 3" in error


def test_a_checkpoints_section_and_a_reports_numbers() -> None:
    """The section of a checkpoint's position (its best epoch's record; none without a trainer's position),
    and the numbers a score report carries (refused, named, when of another epoch or malformed)."""
    history = [{"epoch": 0, "start": True, "val_CIDEr-D": 0.2}, {"epoch": 1, "val_CIDEr-D": 0.4, "val_R@10": 0.3}]
    assert validation.section({"best_epoch": 1, "history": history}) == {
        "epoch": 1, "metrics": {"CIDEr-D": 0.4, "R@10": 0.3}}
    assert validation.section({}) == validation.section(None) == {"epoch": None, "metrics": {}}
    with pytest.raises(CaprlError, match="best.pt \\(its training history\\): best_epoch 2 has no record"):
        validation.section({"best_epoch": 2, "history": history}, "best.pt")
    report = {"best_epoch": 1, "validation": validation.section({"best_epoch": 1, "history": history})}
    assert validation.numbers(report) == {"CIDEr-D": 0.4, "R@10": 0.3}
    assert validation.numbers({"best_epoch": 1}) == {}  # a report made by hand: the tables say so
    with pytest.raises(CaprlError, match="r.json: its validation numbers are of epoch 1, .* epoch 0"):
        validation.numbers({**report, "best_epoch": 0}, "r.json")
    with pytest.raises(CaprlError, match="r.json: its 'validation' is not a section"):
        validation.numbers({"validation": {"CIDEr-D": 0.4}}, "r.json")


def test_evaluate_writes_the_validation_numbers_of_the_epoch_its_checkpoint_holds(
        research_dataset: DatasetPaths) -> None:
    """A real checkpoint whose training history chose epoch 2 (of 0..3): its score file's ``validation``
    is epoch 2's record, beside ``best_epoch`` 2; a checkpoint of another run is refused, named."""
    dataset, work = research_dataset, research_dataset.workdir
    path = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", work / "val-runs" / "fc-xe" / "best.pt")
    ckpt = checkpoint.load(path)
    history = [{"epoch": e, "step": 4 * e, "val_CIDEr-D": c, "val_BLEU-4": c / 4}
               for e, c in enumerate([0.1, 0.3, 0.5, 0.4])]
    ckpt.position = {"epoch": 3, "batch": 0, "step": 12, "best_score": 0.5, "best_epoch": 2,
                     "select": "CIDEr-D", "history": history[:3]}  # best.pt: saved when epoch 2 was the best
    checkpoint.save(path, ckpt)
    other = degenerate_checkpoint(dataset, "fc-scst", "scst", "a", work / "val-runs" / "fc-scst" / "best.pt")
    data = ("--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels", dataset.labels,
            "--features", dataset.features, "--refs", dataset.references["test"])
    jobs = []
    for name, ckpt_path in (("ok", path), ("other", other)):
        out = work / "val-results" / name
        jobs.append(caprl_command("evaluate", dataset.params, "--dataset", "synthetic", "--run", "fc-xe",
                                  "--checkpoint", ckpt_path, *data, "--out-captions", out / "captions.json",
                                  "--out-scores", out / "scores.json", "--out-examples", out / "examples.json"))
    procs = [subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in jobs]
    outputs = [p.communicate(timeout=240) for p in procs]
    done = [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs)]
    assert done[0].returncode == 0, done[0].stderr[-3000:]
    scores = io.read_json(work / "val-results" / "ok" / "scores.json")
    assert scores["best_epoch"] == 2
    assert scores["validation"] == {"epoch": 2, "metrics": {"CIDEr-D": 0.5, "BLEU-4": 0.125}}
    error = user_error(done[1], "evaluate")
    assert f"{other}: a checkpoint of run 'fc-scst', not of --run fc-xe" in error


def test_fig4_chooses_its_operating_point_on_validation_as_the_table_does() -> None:
    """Paper 004's Fig. 4 (``caprl psst-figures``) reads its ρ curves as the table psst_rho does. Test curves:
    x0 = 1.30, every R@10 40%. Validation curves (0.1 lower; st_multinomial's, ρ = 0 of PSST Multinomial,
    0.2 lower): x0 = 1.10, where each ρ curve's test R@10 is read a third of the way from 40% to 70%, 50%,
    and st_multinomial's at its top run, 40%. On the test curves (the figure before) every point was 40%."""
    from caprl.figures import discriminative as figs
    from caprl.tables.psst import psst_rho

    params = params_mod.resolve(default_params())
    reports = family_reports(params)
    for report in reports.values():
        if report["run"].startswith("fc-st_multinomial"):
            report["validation"]["metrics"]["CIDEr-D"] += VAL_SHIFT
    ax = figs.fig4(params, DATASET, reports).axes[0]
    assert "CIDEr-D = 1.1 (auto, on validation" in ax.get_title()
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.lines}
    assert lines["PSST Multinomial"] == pytest.approx([40.0, 50.0, 50.0])
    assert lines["PSST Gumbel Softmax"] == pytest.approx([50.0, 50.0, 50.0])
    table = psst_rho(params, DATASET, reports)  # one reading: the table's cells are the figure's points
    assert "CIDEr-D = 1.100 (auto, chosen on validation" in table.title
    assert {label: pytest.approx([c.ours for c in cells]) for label, cells in table.rows} == lines
