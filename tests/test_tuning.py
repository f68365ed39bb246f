"""Tuning on the validation split: grid points as runs, the same budget for every tuned run, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, default_params
from caprl import params as params_mod, run_points
from caprl.errors import CaprlError
from caprl.workflow.tuning import choose, markdown, point_score
from caprl.workflow.plan import build_plan


def tuned(grids: dict, budget: int = 3) -> dict:
    params = default_params()
    params["tuning"] = {"budget": budget, "runs": grids}
    return params


def test_every_point_is_a_run_with_its_options_and_never_evaluated():
    params = tuned({"fc-scst": {"lr": [1e-4, 3e-4, 1e-3]}, "fc-luo2018-lam0_5": {"lr": [1e-4, 3e-4, 1e-3]}})
    out = run_points.expand_tuning(run_points.expand_sweeps(params))
    assert out == run_points.expand_tuning(out)  # idempotent
    names = [r for r, e in out["runs"].items() if run_points.TUNED_FROM in e]
    assert names[:3] == ["fc-scst-tune-lr0_0001", "fc-scst-tune-lr0_0003", "fc-scst-tune-lr0_001"]
    point = params_mod.run_spec(out, "fc-luo2018-lam0_5-tune-lr0_0003")
    assert point.options["lr"] == 3e-4 and point.options["lam"] == 0.5 and point.init["model"] == "fc-xe"
    assert set(run_points.compared_runs(out)) == set(run_points.expand_sweeps(params)["runs"])
    plan = build_plan(params)
    points = plan.tuning_points("synthetic")
    assert [j.run for j in points["fc-scst"]] == names[:3]
    assert not {j.run for j in plan.trained("synthetic")} & set(names)  # all_tables neither trains nor evaluates them
    assert plan.tuning_files() == ["results/tuning/synthetic.md", "results/tuning/synthetic.json"]


def test_the_budget_is_the_same_for_every_tuned_run_and_names_are_checked():
    with pytest.raises(CaprlError, match="tuning.runs.fc-scst: 2 points, but tuning.budget is 3"):
        run_points.expand_tuning(tuned({"fc-scst": {"lr": [1e-4, 1e-3]}}))
    with pytest.raises(CaprlError, match="tuning.runs.fc-nothing"):
        run_points.expand_tuning(tuned({"fc-nothing": {"lr": [1e-4, 3e-4, 1e-3]}}))
    with pytest.raises(CaprlError, match="objectives.scst has no option 'bogus'"):
        build_plan(tuned({"fc-scst": {"bogus": [1, 2, 3]}}))


def test_a_point_ranks_by_its_best_trained_epoch_and_the_first_of_equals_wins():
    history = {"epochs": [{"epoch": 0, "val_CIDEr-D": 1.5}, {"epoch": 1, "val_CIDEr-D": 1.2},
                          {"epoch": 2, "val_CIDEr-D": 1.4}]}
    assert point_score(history, "CIDEr-D", "h") == {"best": 1.4, "epoch": 2, "start": 1.5}
    assert choose([{"best": 1.0}, {"best": 2.0}, {"best": 2.0}]) == 1
    with pytest.raises(CaprlError, match="no trained epoch"):
        point_score({"epochs": [{"epoch": 0, "val_R@10": 0.5}]}, "R@10", "h")


def test_tune_report_reads_the_points_histories(tmp_path: Path):
    """The real stage on histories where the middle learning rate wins on val CIDEr-D."""
    params = tuned({"fc-scst": {"lr": [1e-4, 3e-4, 1e-3]}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for name, best in (("fc-scst-tune-lr0_0001", 1.1), ("fc-scst-tune-lr0_0003", 1.3), ("fc-scst-tune-lr0_001", 0.9)):
        path = tmp_path / "runs" / "synthetic" / name / "history.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"run": name, "epochs": [{"epoch": 0, "val_CIDEr-D": 1.0},
                                                            {"epoch": 1, "val_CIDEr-D": best}]}))
    done = subprocess.run([sys.executable, "-m", "caprl", "tune-report", "--params", "params.yaml", "--dataset",
                           "synthetic", "--out-md", "t.md", "--out-json", "t.json"], cwd=tmp_path, text=True,
                          capture_output=True, env={"CAPRL_PARAMS_SCHEMA": str(REPO / "workflow/schemas/params.schema.yaml"),
                                                    "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "t.json").read_text())
    entry = result["runs"]["fc-scst"]
    assert entry["chosen"] == {"lr": 3e-4} and entry["select"] == "CIDEr-D" and result["budget"] == 3
    assert entry["current"] == {"lr": params_mod.run_spec(params_mod.load(tmp_path / "params.yaml"), "fc-scst").options["lr"]}
    md = (tmp_path / "t.md").read_text()
    assert "| **0.0003** | 1.3000 | 1 | 1.0000 |" in md and "test split was not read" in md
    assert markdown(result) + "\n" == md


def test_a_missing_point_history_names_the_file_and_the_command(tmp_path: Path, monkeypatch):
    from caprl.workflow.tuning import report

    monkeypatch.chdir(tmp_path)
    params = run_points.expand_tuning(run_points.expand_sweeps(tuned({"fc-scst": {"lr": [1e-4, 3e-4, 1e-3]}})))
    with pytest.raises(CaprlError, match=r"fc-scst-tune-lr0_0001/history.json.*snakemake"):
        report(params, "synthetic", tmp_path)


@pytest.mark.parametrize("dataset", ["synthetic", "synthetic_video"])
def test_params_yaml_holds_every_choice_of_the_committed_tuning_report(dataset: str) -> None:
    """The tuning step's choices (results/tuning/<dataset>.json, made on the validation split) are
    the values params.yaml's runs train with: a value changed by hand, or a tuning re-run whose
    choice was not set, fails here. The grid tried must be params.yaml's too (the same budget)."""
    report = json.loads((REPO / "results" / "tuning" / f"{dataset}.json").read_text())
    params = params_mod.load(REPO / "params.yaml")
    assert report["budget"] == params["tuning"]["budget"]
    grids = params["tuning"]["runs"]
    assert set(report["runs"]) <= set(grids), "a tuned run that params.yaml no longer tunes"
    untuned = {run for run in grids if dataset in params_mod.run_spec(params, run).datasets} - set(report["runs"])
    assert not untuned, f"params.yaml tunes {sorted(untuned)}, which the committed report has no points of"
    for run, entry in report["runs"].items():
        tried = sorted(tuple(sorted(point["options"].items())) for point in entry["points"])
        lists = {option: params["sweeps"][name] for option, name in grids[run].items()}
        assert [dict(t) for t in tried] == sorted(({o: v} for o, values in lists.items() for v in values),
                                                  key=lambda d: tuple(sorted(d.items()))), run
        trained = {option: params_mod.run_spec(params, run).options[option] for option in entry["chosen"]}
        assert trained == entry["chosen"], f"runs.{run}: params.yaml trains {trained}, the tuning chose {entry['chosen']}"


def test_a_merge_takes_the_new_reports_entries_keeps_each_label_and_drops_runs_no_longer_tuned() -> None:
    """Re-tuning some runs only: ``caprl tune-report --merge OLD NEW`` keeps OLD's entries of the runs
    NEW has no points of (with their own ``tuned_at``), NEW's for the others, and none of a run
    params.yaml no longer tunes; a run neither holds is an error naming it."""
    from caprl.workflow.tuning import merge

    params = tuned({"fc-xe": {"lr": "lr_xe"}, "fc-scst": {"lr": "lr"}})

    def entry(lr: float, label: str) -> dict:
        point = {"run": "x", "options": {"lr": lr}, "best": 1.0, "epoch": 1, "start": None}
        return {"method": "m", "select": "CIDEr-D", "points": [point], "chosen": {"lr": lr},
                "current": {"lr": 0.0}, "tuned_at": label}

    old = {"dataset": "synthetic", "budget": 3, "runs": {"fc-xe": entry(1e-3, "old"), "fc-scst": entry(1e-4, "old"),
                                                         "fc-gone": entry(1.0, "old")}}
    new = {"dataset": "synthetic", "budget": 3, "runs": {"fc-scst": entry(2e-4, "new")}}
    merged = merge(params, old, new, where="test")
    assert list(merged["runs"]) == ["fc-xe", "fc-scst"]
    assert merged["runs"]["fc-xe"]["tuned_at"] == "old" and merged["runs"]["fc-scst"]["tuned_at"] == "new"
    assert merged["runs"]["fc-scst"]["chosen"] == {"lr": 2e-4}
    assert merged["runs"]["fc-scst"]["current"] == {"lr": params_mod.run_spec(params, "fc-scst").options["lr"]}
    assert "Tuned at new." in markdown(merged)
    del old["runs"]["fc-xe"]
    with pytest.raises(CaprlError, match="run fc-xe"):
        merge(params, old, new, where="test")
