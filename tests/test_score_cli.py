"""`caprl score` through a real subprocess: output, and clear errors for bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_rewards import coco_raw

N_IMAGES = 30


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    raw = coco_raw()
    ids = list(raw)[:N_IMAGES]
    root = tmp_path_factory.mktemp("score")
    refs = {
        "images": [{"id": i, "file_name": f"{i}.jpg"} for i in ids],
        "annotations": [{"image_id": i, "id": 10 * i + k, "caption": c} for i in ids for k, c in enumerate(raw[i][1:])],
    }
    results = [{"image_id": i, "caption": raw[i][0]} for i in ids]
    paths = {
        "refs": root / "refs.json",
        "results": root / "results.json",
        "unknown_ids": root / "unknown_ids.json",
        "malformed": root / "malformed.json",
        "not_a_list": root / "not_a_list.json",
        "no_caption": root / "no_caption.json",
    }
    paths["refs"].write_text(json.dumps(refs))
    paths["results"].write_text(json.dumps(results))
    paths["unknown_ids"].write_text(json.dumps(results + [{"image_id": 123456789, "caption": "a dog"}]))
    paths["malformed"].write_text('[{"image_id": 1, "caption": "a dog"},\n {"image_id": 2 "caption": "a cat"}]')
    paths["not_a_list"].write_text(json.dumps({"image_id": 1, "caption": "a dog"}))
    paths["no_caption"].write_text(json.dumps([{"image_id": ids[0]}]))
    return paths


def score(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "caprl", "score", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_scores_as_json_without_params_file(files, tmp_path):
    assert not (tmp_path / "params.yaml").exists()
    out = tmp_path / "scores.json"
    args = ["--refs", str(files["refs"]), "--results", str(files["results"]), "--per-image", "--out", str(out)]
    done = score(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads(out.read_text())
    assert set(printed["corpus"]) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D"} | (
        {"SPICE"} if "SPICE" not in printed["unavailable"] else set()
    )
    assert 0.3 < printed["corpus"]["BLEU-1"] <= 1 and printed["corpus"]["CIDEr-D"] > 0.3
    assert len(printed["per_image"]) == N_IMAGES


@pytest.mark.parametrize(
    "name, message",
    [
        ("unknown_ids", "1 image id(s) not found in"),
        ("malformed", "malformed JSON at line 2"),
        ("not_a_list", "expected COCO results: a list"),
        ("no_caption", "[0]: missing key 'caption'"),
    ],
)
def test_bad_results_fail_with_a_message_naming_the_problem(files, tmp_path, name, message):
    done = score("--refs", str(files["refs"]), "--results", str(files[name]), "--metrics", "bleu", cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and str(files[name]) in done.stderr
    assert "Traceback" not in done.stderr
    if name == "unknown_ids":
        assert "123456789" in done.stderr


def test_bad_references_fail_with_a_message(files, tmp_path):
    done = score("--refs", str(files["results"]), "--results", str(files["results"]), cwd=tmp_path)
    assert done.returncode == 2 and "'annotations' list" in done.stderr
    done = score("--refs", str(tmp_path / "nope.json"), "--results", str(files["results"]), cwd=tmp_path)
    assert done.returncode == 2 and "references file not found" in done.stderr
