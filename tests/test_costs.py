"""`caprl plan` (caprl.workflow.costs): every job of the plan with its estimated hours, from measured step costs."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from caprl import params as params_mod
from caprl.workflow import costs, plan_report
from caprl.workflow.plan import build_plan

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"
COCO_TRAIN = 113_287


@pytest.fixture(scope="module")
def params() -> dict[str, Any]:
    return params_mod.load(PARAMS)


@pytest.fixture(autouse=True)
def no_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where no data/<ds>/annotations.json exists, so the sizes are params' or the known ones."""
    monkeypatch.chdir(tmp_path)


def rows_by_job(result: costs.Estimate) -> dict[str, costs.Row]:
    return {row.job: row for row in result.rows}


def coco_overlay(path: Path, **train: Any) -> Path:
    """A recipe-like file: COCO with two runs, the built-in sets off."""
    overlay = {"datasets": {"synthetic": {"enabled": False}, "synthetic_video": {"enabled": False},
                            "coco": {"enabled": True, "runs": ["topdown-xe", "topdown-scst"], "tables": ["main"]}},
               "models": {"topdown": {"embed_size": 512, "hidden_size": 512, "att_hidden_size": 512}},
               "tuning": {"runs": {}}}
    if train:
        overlay["train"] = train
    path.write_text(yaml.safe_dump(overlay), encoding="utf-8")
    return path


def test_every_training_job_of_the_plan_is_listed(params: dict[str, Any]) -> None:
    result = costs.estimate(params)
    plan = build_plan(params)
    listed = {row.job for row in result.rows if row.rule == "train"}
    assert listed == {f"train {ds}/{run}" for ds, run in plan.jobs}
    for row in result.rows:
        if row.rule == "train":
            assert row.hours is not None and row.hours > 0 and row.peak_mib and row.peak_mib > 0, row
            assert row.target == ("tuning" if plan.jobs[(row.dataset, row.run)].tuning else "all_tables")
    evaluated = {f"evaluate {ds}/{job.run}" for ds in plan.datasets for job in plan.evaluated(ds)}
    assert evaluated == {row.job for row in result.rows if row.rule == "evaluate"}


def test_doubling_epochs_doubles_the_training_estimate(params: dict[str, Any]) -> None:
    doubled = copy.deepcopy(params)
    for run in ("topdown-xe", "fc-scst"):
        epochs = params_mod.run_spec(params, run).options["epochs"]
        doubled["runs"][run] = {**params["runs"][run], "options": {**params["runs"][run].get("options", {}),
                                                                   "epochs": 2 * epochs}}
    one, two = rows_by_job(costs.estimate(params)), rows_by_job(costs.estimate(doubled))
    job = "train synthetic/topdown-xe"  # no init run: one validation per epoch, nothing else
    assert two[job].steps == 2 * one[job].steps
    assert two[job].hours == pytest.approx(2 * one[job].hours, rel=1e-9)
    job = "train synthetic/fc-scst"  # starts from fc-xe: one more validation, of the start
    assert two[job].steps == 2 * one[job].steps
    assert two[job].hours == pytest.approx(2 * one[job].hours, rel=0.02)
    assert two["train synthetic/fc_lstm_state-sll_me"].hours == one["train synthetic/fc_lstm_state-sll_me"].hours


def test_a_larger_batch_changes_the_steps_and_the_step_time(params: dict[str, Any]) -> None:
    big = copy.deepcopy(params)
    big["train"]["batch_size"] = 200
    small_rows, big_rows = rows_by_job(costs.estimate(params)), rows_by_job(costs.estimate(big))
    job = "train synthetic/topdown-scst"
    epochs, n_train = params_mod.run_spec(params, "topdown-scst").options["epochs"], params["synthetic"]["n_train"]
    assert small_rows[job].steps == epochs * math.ceil(n_train / 50)
    assert big_rows[job].steps == epochs * math.ceil(n_train / 200)
    # a step of 200 images costs more than one of 50, less than 4 (the H100's measured curve)
    small_ms = small_rows[job].hours / small_rows[job].steps
    big_ms = big_rows[job].hours / big_rows[job].steps
    assert small_ms < big_ms < 4 * small_ms


def test_h100_figures_are_used_where_measured_and_cpu_scaled_elsewhere(params: dict[str, Any]) -> None:
    est = costs.Estimator(params, costs.load_costs(), "h100")
    assert est.base_ms("scst", "topdown", 50) == (96.0, "measured")
    assert est.base_ms("scst", "topdown", 250) == (163.0, "measured")
    ms, basis = est.base_ms("xe", "fc", 50)
    assert basis == "scaled from CPU" and ms == pytest.approx(521 / (2339 / 96))
    cpu = costs.Estimator(params, costs.load_costs(), "cpu")
    assert cpu.base_ms("xe", "fc", 30) == (pytest.approx((141 + 521) / 2), "measured")  # linear between 10 and 50
    assert cpu.base_ms("xe", "fc", 90)[0] == pytest.approx(521 + (521 - 141))  # linear beyond them
    assert cpu.size_factor(256, 36, "xe", False) == pytest.approx(0.25)  # quadratic in the hidden size


def test_h200_figures_and_the_footer_name_the_device(params: dict[str, Any]) -> None:
    est = costs.Estimator(params, costs.load_costs(), "h200")
    assert est.base_ms("scst", "topdown", 50) == (71.1, "measured")
    assert est.base_ms("xe", "fc", 250) == (30.1, "measured")
    assert est.cpu_ratio()[0] == pytest.approx(2339 / 71.1)
    text = plan_report.render(costs.estimate(params, "h200"), "table", "h200", ["params.yaml"], costs.load_costs())
    assert "one NVIDIA H200" in text and "(CPU / H200, SCST Top-Down, batch 50)" in text and "H100" not in text
    cpu = plan_report.render(costs.estimate(params, "cpu"), "table", "cpu", ["params.yaml"], costs.load_costs())
    assert "scaled from CPU" not in cpu.split("basis:")[-1]


def test_unknown_method_and_architecture_fall_back_to_the_stated_rule(params: dict[str, Any]) -> None:
    table = costs.load_costs()
    del table["methods"]["c2f"], table["architectures"]["stackcap"]
    row = rows_by_job(costs.estimate(params, "h100", table))["train synthetic/stackcap-c2f"]
    assert "fallback: method c2f as scst" in row.basis and "fallback: arch stackcap as topdown" in row.basis
    assert row.hours is not None and 0 < row.hours < 1 and row.peak_mib
    m, a, notes = costs.Estimator(params, table, "cpu").lookup("no_such_method", "no_such_arch")
    assert (m, a) == (table["fallback_method"], table["fallback_arch"]) and len(notes) == 2


def test_coco_overlay_counts_the_karpathy_split_in_a_real_subprocess(tmp_path: Path) -> None:
    recipe = coco_overlay(tmp_path / "coco.yaml")
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "caprl", "plan", "--params", str(PARAMS), str(recipe),
                           "--format", "json", "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert out.read_text(encoding="utf-8") == done.stdout
    assert data["datasets"]["coco"]["train"] == COCO_TRAIN and data["unit"] == "GPU-hours"
    rows = {row["job"]: row for row in data["jobs"]}
    assert {"train coco/topdown-xe", "train coco/topdown-scst", "evaluate coco/topdown-scst"} <= set(rows)
    xe_epochs = params_mod.run_spec(params_mod.load(PARAMS), "topdown-xe").options["epochs"]
    assert rows["train coco/topdown-xe"]["steps"] == xe_epochs * math.ceil(COCO_TRAIN / 50)
    assert "196 regions" in rows["train coco/topdown-xe"]["basis"]  # ResNet grid 14 x 14
    assert rows["features coco/shard0"]["steps"] == math.ceil((COCO_TRAIN + 10_000) / 2)
    costed = [row["hours"] for row in data["jobs"] if row["hours"] is not None]
    assert data["totals"]["hours"] == pytest.approx(sum(costed), rel=1e-12) and data["totals"]["hours"] > 1
    assert data["totals"]["jobs"] == len(data["jobs"])
    by_rule = data["totals"]["by_rule"]
    assert sum(v["hours"] or 0 for v in by_rule.values()) == pytest.approx(data["totals"]["hours"])


def test_annotations_when_present_give_the_sizes(tmp_path: Path) -> None:
    images = [{"id": i, "file": f"{i}.jpg", "split": split, "captions": [["a"]] * caps, "raw": ["a"] * caps}
              for i, (split, caps) in enumerate([("train", 5)] * 7 + [("train", 3)] + [("val", 5)] * 2 + [("test", 5)])]
    (tmp_path / "data/coco").mkdir(parents=True)
    (tmp_path / "data/coco/annotations.json").write_text(json.dumps({"dataset": "coco", "images": images}))
    params = params_mod.load([PARAMS, coco_overlay(tmp_path / "coco.yaml")])
    result = costs.estimate(params, "cpu")
    sizes = result.sizes["coco"]
    assert (sizes.train, sizes.val, sizes.test, sizes.captions) == (8, 2, 1, pytest.approx(38 / 8))
    assert rows_by_job(result)["train coco/topdown-xe"].steps == params_mod.run_spec(params, "topdown-xe").options[
        "epochs"] * math.ceil(8 / 50)


def test_table_and_markdown_show_readable_totals(params: dict[str, Any]) -> None:
    table = costs.load_costs()
    result = costs.estimate(params, "cpu", table)
    text = plan_report.render(result, "table", "cpu", ["params.yaml"], table)
    assert "train synthetic/topdown-scst" in text and "CPU-hours" in text and "\ntotal " in text
    md = plan_report.render(result, "md", "cpu", ["params.yaml"], table)
    assert md.startswith("| job | steps | hours | peak mem | basis |")
    assert plan_report.hours_text(12.34) == "12.3 h" and plan_report.hours_text(0.5) == "30 min" and plan_report.hours_text(None) == "-"
    assert plan_report.mib_text(1536) == "1.5 GiB"
