"""A dataset with ``backbone: bottomup`` through the real workflow: bottom-up-attention TSV rows
(written as its generate_tsv.py writes them) for the synthetic images, then Snakemake makes the
features file with ``caprl bottomup`` and trains an attention model (topdown, over the 36 boxes)
and an fc model (on their mean) from it. Also: the params checks and the missing-TSV message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from caprl.models import checkpoint
from caprl.workflow import plan as wp
from caprl.errors import CaprlError
from conftest import REPO, TINY, default_params, merge
from test_bottomup import BOXES, DIM, make_row, write_tsv

TSV = "data/raw/bottomup/synthetic_36.tsv"
RUNS = ("fc-xe", "topdown-xe")
EXTRA_IDS = (10_000_001, 10_000_002)  # rows of images the annotations do not list: left out


def bottomup_params() -> dict[str, Any]:
    params = merge(default_params(), TINY)
    params["datasets"]["synthetic"].update(backbone="bottomup", bottomup_tsv=[TSV])
    params["runs"] = {"fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 1}},
                      "topdown-xe": {"method": "xe", "model": "topdown", "options": {"epochs": 1}}}
    params["tables"] = ["main"]
    return params


def run(cmd: list[str], cwd: Path, timeout: int = 300) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def annotated_ids(work: Path, params_path: Path) -> list[int]:
    """The image ids of the synthetic dataset, made by the real `caprl synthesize` and `caprl prepare`
    in a scratch folder (the generator is seeded by params.yaml: the workflow makes the same images)."""
    scratch = work / "scratch"

    def caprl(stage: str, *args: str | Path) -> None:
        run([sys.executable, "-m", "caprl", stage, "--params", str(params_path), "--dataset", "synthetic",
             *map(str, args)], work)

    caprl("synthesize", "--out-raw", scratch / "raw.json", "--media-dir", scratch / "images")
    caprl("prepare", "--raw", scratch / "raw.json", "--media-root", scratch / "images",
          "--out", scratch / "annotations.json")
    ids = [int(im["id"]) for im in json.loads((scratch / "annotations.json").read_text())["images"]]
    shutil.rmtree(scratch)
    return ids


@pytest.mark.e2e
def test_snakemake_trains_on_bottomup_features(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, work / name)
    params_path = work / "params.yaml"
    params_path.write_text(yaml.safe_dump(bottomup_params(), sort_keys=False))
    ids = annotated_ids(work, params_path)
    rng = np.random.default_rng(0)
    (work / TSV).parent.mkdir(parents=True)
    write_tsv(work / TSV, [make_row(i, rng) for i in [*EXTRA_IDS, *reversed(ids)]])

    run(["snakemake", "--cores", "2", *(wp.CHECKPOINT.format(dataset="synthetic", run=r) for r in RUNS)], work)

    features = work / wp.FEATURES.format(dataset="synthetic", backbone="bottomup")
    with h5py.File(features, "r") as h5:
        assert h5.attrs["backbone"] == "bottomup" and h5.attrs["n_regions"] == BOXES and h5.attrs["grid"] == 0
        assert h5["regions"].shape == (len(ids), BOXES, DIM) and h5["boxes"].shape == (len(ids), BOXES, 4)
        assert sorted(h5["image_ids"][:]) == sorted(ids)
    assert (work / "logs/synthetic/features_bottomup.log").is_file()
    assert not (work / "data/synthetic/features").exists()  # no shards: nothing extracted from the images
    for name in RUNS:
        ckpt = checkpoint.load(work / wp.CHECKPOINT.format(dataset="synthetic", run=name))
        shape = ckpt.module(checkpoint.MODEL).shape
        assert (shape["feat_dim"], shape["n_regions"]) == (DIM, BOXES), name


@pytest.mark.parametrize("edit, expected", [
    (lambda ds: ds.pop("bottomup_tsv"), r"datasets\.coco\.bottomup_tsv: backbone bottomup .* list them here"),
    (lambda ds: ds.update(backbone="resnet101"), r"datasets\.coco\.bottomup_tsv: only read with backbone: bottomup"),
    (lambda ds: ds.update(format="tgif"), r"datasets\.coco\.backbone: bottomup features are of images"),
])
def test_bad_bottomup_params_name_the_key(edit: Any, expected: str) -> None:
    params = default_params()
    params["datasets"]["coco"].update(backbone="bottomup", bottomup_tsv=["trainval_36.tsv"])
    edit(params["datasets"]["coco"])
    with pytest.raises(CaprlError, match=expected):
        wp.build_plan(params)


def test_a_missing_tsv_says_where_and_how(tmp_path: Path) -> None:
    """`snakemake -n` stops before any job, naming the key, the file and where to get it."""
    params = merge(default_params(), TINY)
    params["datasets"]["synthetic"].update(backbone="bottomup", bottomup_tsv=[TSV])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for name in ("Snakefile", "workflow"):
        (tmp_path / name).symlink_to(REPO / name)
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "all_tables"], capture_output=True, text=True,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"datasets.synthetic.bottomup_tsv: {TSV} does not exist" in out
    assert "github.com/peteanderson80/bottom-up-attention" in out and "trainval_36.zip" in out
    assert "caprl download does not fetch" in out
    assert not (tmp_path / "data").exists()
