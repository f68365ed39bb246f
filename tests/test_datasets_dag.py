"""Datasets are a dimension of the DAG: two generated datasets through Snakemake and DVC.

A tiny configuration with two synthetic datasets (``synthetic`` and ``shapes_b``, the second
with one object per image and fewer images), ``fc-xe`` on both and ``fc-scst`` on
``shapes_b`` only, and the main table. Real Snakemake, and the dvc.yaml that ``caprl dvc-yaml``
writes for that configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import two_dataset_params
from test_e2e import check_dvc_lock, fresh_copy, run

pytestmark = pytest.mark.e2e

DATASETS = ("synthetic", "shapes_b")
TRAINED = {"synthetic": ["fc-xe"], "shapes_b": ["fc-xe", "fc-scst"]}


def params() -> dict:
    p = two_dataset_params()
    p["runs"] = {"fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 2}},
                 "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}, "datasets": ["shapes_b"]}}
    p["tables"] = ["main"]
    return p


@pytest.fixture(scope="module")
def snakemake_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = fresh_copy(tmp_path_factory.mktemp("datasets") / "snakemake", params())
    run(["snakemake", "--cores", "2", "all_tables"], work)
    return work


def test_every_path_carries_the_dataset_and_runs_follow_their_datasets(snakemake_work: Path) -> None:
    raw = {ds: json.loads((snakemake_work / "data" / "raw" / ds / f"dataset_{ds}.json").read_text())
           for ds in DATASETS}
    assert [len(raw[ds]["images"]) for ds in DATASETS] == [80 + 16 + 16, 60 + 16 + 16]
    assert raw["synthetic"]["dataset"] == "synthetic" and raw["shapes_b"]["dataset"] == "shapes_b"
    first = {ds: [im["sentences"][0]["raw"] for im in raw[ds]["images"][80 if ds == "synthetic" else 60:]]
             for ds in DATASETS}
    assert first["synthetic"] != first["shapes_b"]  # the same sizes for val/test, other images
    for ds in DATASETS:
        annotations = json.loads((snakemake_work / "data" / ds / "annotations.json").read_text())
        assert annotations["dataset"] == ds
        backbone = yaml.safe_load((snakemake_work / "params.yaml").read_text())["datasets"][ds]["backbone"]
        assert (snakemake_work / "data" / ds / f"features_{backbone}.h5").exists()
        assert sorted(p.name for p in (snakemake_work / "runs" / ds).iterdir()) == sorted(TRAINED[ds])
        for r in TRAINED[ds]:
            report = json.loads((snakemake_work / "results" / ds / r / "scores.json").read_text())
            assert report["dataset"] == ds and report["run"] == r
        for ext in ("md", "csv", "tex"):
            assert (snakemake_work / "results" / "tables" / f"{ds}_main.{ext}").stat().st_size > 0
        assert (snakemake_work / "logs" / ds / "prepare.log").exists()
    assert not (snakemake_work / "results" / "synthetic" / "fc-scst").exists()


def test_the_generated_dvc_yaml_follows_the_runs_datasets(snakemake_work: Path, tmp_path: Path) -> None:
    """`caprl dvc-yaml` in a copy: a stage per (dataset, run) the run belongs to. That `dvc repro`
    of such a file gives Snakemake's metrics is shown by test_e2e's DVC run (two datasets with --full), and
    that both tools run the same commands by test_dag_parity (two datasets, run subsets)."""
    work = fresh_copy(tmp_path / "dvc", yaml.safe_load((snakemake_work / "params.yaml").read_text()))
    run(["caprl", "dvc-yaml"], work)
    stages = yaml.safe_load((work / "dvc.yaml").read_text())["stages"]
    assert {"synthetic-train-fc-xe", "shapes_b-train-fc-xe", "shapes_b-train-fc-scst"} <= set(stages)
    assert "synthetic-train-fc-scst" not in stages


def test_dvc_lock_records_a_snakemake_run(snakemake_work: Path, tmp_path: Path) -> None:
    """After the main command, `caprl dvc-lock` in a copy (two datasets, run subsets): `dvc status`
    tells the truth (every stage up to date) and Snakemake still has nothing to do. (`pytest --full`
    also runs it on test_e2e's whole run.)"""
    lock = check_dvc_lock(snakemake_work, tmp_path / "lock")
    assert {"synthetic-train-fc-xe", "shapes_b-train-fc-xe", "shapes_b-train-fc-scst"} <= lock
