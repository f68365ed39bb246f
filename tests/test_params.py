"""params.yaml validation: unknown keys and wrong types are errors naming the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from caprl import params as params_mod
from caprl.errors import CaprlError
from conftest import REPO, default_params


def test_repository_params_are_valid() -> None:
    params_mod.load(REPO / "params.yaml")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p["train"].__setitem__("batch_sise", 5), "train.batch_sise"),
        (lambda p: p["train"].__setitem__("batch_size", "fifty"), "train.batch_size"),
        (lambda p: p.__setitem__("extra_section", {}), "extra_section"),
        (lambda p: p["models"]["fc"].__setitem__("hiden_size", 3), "models.fc.hiden_size"),
        (lambda p: p["objectives"]["scst"].__setitem__("lr", "fast"), "objectives.scst.lr"),
    ],
)
def test_bad_params_name_the_key(write_params, edit, expected: str) -> None:
    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=expected.replace(".", r"\.")):
        params_mod.load(write_params(params))


def test_stage_refuses_bad_params_and_writes_nothing(write_params, tmp_path) -> None:
    params = default_params()
    params["vocab"]["min_count"] = "five"
    path = write_params(params)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "caprl", "synthesize", "--params", str(path), "--out-json", str(out),
         "--image-dir", str(tmp_path / "images")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "vocab.min_count" in proc.stderr
    assert not out.exists() and not (tmp_path / "images").exists()


def test_snakemake_validates_before_any_job(write_params, tmp_path) -> None:
    params = default_params()
    params["decode"]["beam"] = 3
    write_params(params)
    for name in ("Snakefile", "workflow"):
        (tmp_path / name).symlink_to(REPO / name)
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "all_tables"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "beam" in proc.stdout + proc.stderr


def test_missing_real_data_says_where_and_how(write_params, tmp_path) -> None:
    params = default_params()
    params["dataset"].update(name="coco", karpathy_json="data/raw/coco/dataset_coco.json",
                             image_root="data/raw/coco", synthetic=False)
    write_params(params)
    for name in ("Snakefile", "workflow"):
        (tmp_path / name).symlink_to(REPO / name)
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "all_tables"], capture_output=True, text=True,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "data/raw/coco/dataset_coco.json does not exist" in out and "Karpathy" in out and "README" in out
    assert not (tmp_path / "data").exists()
