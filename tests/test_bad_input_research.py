"""Bad inputs that used to give a traceback, a late error or silent scores, through the real CLI.

1. caption files that are not UTF-8 (Karpathy JSON, TGIF TSV, COCO references);
2. a dataset without validation images, stopped at ``caprl prepare``;
3. ``init`` naming a run that cannot give the checkpoint (``snakemake -n``), a missing ``--init`` file;
4. a ``caprl features`` killed by SIGKILL: its temporary file is removed by the re-run;
5. a model giving every image the same caption, or none: flagged in scores.json and the tables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from caprl import io
from caprl.evaluation.degenerate import MIN_DISTINCT_FRACTION, degenerate_warnings
from caprl.data.feature_store import open_features_file
from conftest import REPO, TINY, default_params, merge
from pipeline_data import DatasetPaths, caprl_command
from stage_inputs import LOOKAHEAD_ON_XE, caprl, degenerate_checkpoint, temporaries, user_error, write_params


def karpathy_set(folder: Path, splits: list[str]) -> Path:
    """A tiny Karpathy-split JSON (one image per split entry, 8x8 PNGs under folder/images)."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images = []
    for k, split in enumerate(splits):
        Image.new("RGB", (8, 8), (30 * k, 0, 0)).save(folder / "images" / f"{k}.png")
        images.append({"filename": f"{k}.png", "imgid": k, "split": split,
                       "sentences": [{"raw": f"a red circle number {k}"}]})
    path = folder / "dataset.json"
    path.write_text(json.dumps({"images": images}, indent=1))
    return path


# -- 1. caption files that are not UTF-8 -----------------------------------------------------

def test_caption_files_that_are_not_utf8_name_the_file_line_and_byte(tmp_path: Path) -> None:
    params = write_params(tmp_path, merge(default_params(), TINY))
    raw = karpathy_set(tmp_path / "k", ["train", "val", "test"])
    text = raw.read_text()
    raw.write_bytes(text.replace("number 1", "num\xe9ro 1").encode("latin-1"))  # an editor's Latin-1
    line = 1 + text[:text.index("number 1")].count("\n")
    out = tmp_path / "annotations.json"
    err = user_error(caprl("prepare", params, "--dataset", "synthetic", "--raw", raw, "--media-root",
                           raw.parent / "images", "--out", out, cwd=tmp_path), "prepare")
    assert f"{raw}: line {line}, column " in err and "byte 0xe9 is not UTF-8" in err and "byte offset" in err
    assert "iconv -f latin1 -t utf-8" in err and "Karpathy-split JSON must be UTF-8" in err
    assert not out.exists() and not temporaries(tmp_path)

    tgif = tmp_path / "tgif"
    tgif.mkdir()
    (tgif / "train.txt").write_text("https://x.org/a.gif\n")
    (tgif / "tgif-v1.0.tsv").write_bytes(b"https://x.org/a.gif\ta cat\nhttps://x.org/a.gif\ta caf\xe9 cat\n")
    err = user_error(caprl("prepare", params, "--dataset", "synthetic_video", "--raw", tgif / "tgif-v1.0.tsv",
                           "--media-root", tgif, "--out", out, cwd=tmp_path), "prepare")
    assert f"{tgif / 'tgif-v1.0.tsv'}: line 2, column 26 (byte offset 51): byte 0xe9" in err
    assert "TGIF sentence file must be UTF-8" in err

    refs, results = tmp_path / "refs.json", tmp_path / "results.json"
    refs.write_bytes(b'{"annotations": [{"image_id": 1, "id": 0, "caption": "\xff a dog"}]}')
    results.write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
    err = user_error(caprl("score", params, "--refs", refs, "--results", results, "--metrics", "bleu",
                           cwd=tmp_path), "score")
    assert f"{refs}: line 1, column 55 (byte offset 54): byte 0xff is not UTF-8" in err


# -- 2. a split with no validation images ----------------------------------------------------

def test_a_dataset_without_val_images_stops_at_prepare_naming_the_file_and_split(tmp_path: Path) -> None:
    raw = karpathy_set(tmp_path / "k", ["train", "restval", "test"])
    out = tmp_path / "annotations.json"
    params = merge(default_params(), TINY)
    args = ("--dataset", "synthetic", "--raw", raw, "--media-root", raw.parent / "images", "--out", out)
    err = user_error(caprl("prepare", write_params(tmp_path, params), *args, cwd=tmp_path), "prepare")
    assert f"{raw}: the val split of dataset synthetic is empty (2 train, 0 val, 1 test images)" in err
    assert "best epoch on validation CIDEr-D" in err and '"split": "val"' in err
    assert "datasets.synthetic.runs: []" in err and not out.exists()

    params["datasets"]["synthetic"]["runs"] = []  # nothing trains on it: val is not needed
    proc = caprl("prepare", write_params(tmp_path, params), *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    params["evaluate"]["split"] = "val"  # ... but the split evaluation scores is
    err = user_error(caprl("prepare", write_params(tmp_path, params), *args, cwd=tmp_path), "prepare")
    assert "the val split of dataset synthetic is empty" in err and "evaluation scores it (evaluate.split)" in err
    assert "or set evaluate.split to a split it has" in err and "training" not in err


# -- 3. init runs that cannot give a checkpoint ----------------------------------------------

def snakemake_dry_run(workdir: Path, params: dict[str, Any]) -> subprocess.Popen[str]:
    """``snakemake -n all_tables`` in a copy of the repository's workflow with ``params`` (started)."""
    write_params(workdir, params)
    shutil.copy(REPO / "Snakefile", workdir / "Snakefile")
    shutil.copytree(REPO / "workflow", workdir / "workflow", dirs_exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CAPRL_CORENLP_DIR"}
    return subprocess.Popen(["snakemake", "-n", "--cores", "1", "all_tables"], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def init_params(**init: str) -> dict[str, Any]:
    """TINY with a few runs of params.yaml that start from others; ``init``: fc-scst's."""
    params = merge(default_params(), TINY)
    runs = default_params()["runs"]
    params["runs"] = {name: runs[name] for name in ("fc-xe", "fc-scst", "fc_lstm-xe", "fc_lstm-pg_spider-spider",
                                                     "listener", "fc-luo2018")}
    params["runs"]["fc-scst"]["init"] = init or params["runs"]["fc-scst"]["init"]
    params["spice"]["corenlp_dir"] = "no-corenlp"  # SPICE cannot run here: the spider reward is skipped
    return params


def lookahead_params() -> dict[str, Any]:
    params = init_params()
    params["runs"]["fc-xe"]["decode"] = {"method": "lookahead"}
    return params


def test_snakemake_names_the_init_key_before_building_the_dag(tmp_path: Path) -> None:
    """Every variant in its own copy of the workflow, the dry runs side by side."""
    not_listed = init_params()
    not_listed["datasets"]["synthetic"]["runs"] = ["fc-scst"]
    variants = {
        "runs.fc-scst.init.model: no run named 'fc-nope' under runs:": init_params(model="fc-nope"),
        "runs.fc-scst.init.model: run 'fc-xe' does not train on synthetic": not_listed,
        "runs.fc-scst.init.model: run listener (method listener) trains no caption model":
            init_params(model="listener"),
        "runs.fc-scst.init.model: run 'fc-luo2018' has a sweep: (one run per point), so name one of its points: "
        "fc-luo2018-lam0_5": init_params(model="fc-luo2018"),
        # a run starting from one that cannot run here is skipped, and says why (design: the rest runs)
        "run fc-scst on dataset synthetic is skipped: starts from run fc_lstm-pg_spider-spider, which is skipped":
            init_params(model="fc_lstm-pg_spider-spider"),
        # what the method has: the stages refuse the same in the same words (caprl.objectives.run_checks)
        "runs.fc-scst.init.listener: method scst has no module 'listener' (its runs train model); drop "
        "init.listener": init_params(model="fc-xe", listener="fc-xe"),
        LOOKAHEAD_ON_XE: lookahead_params(),
    }
    jobs = {expected: snakemake_dry_run(tmp_path / str(k), params)
            for k, (expected, params) in enumerate(variants.items())}
    for expected, job in jobs.items():
        out, _ = job.communicate(timeout=300)  # seven dry runs side by side: minutes under load, not a hang
        assert expected in out and "MissingInput" not in out, out[-3000:]
        assert (job.returncode == 0) == ("skipped" in expected), out[-3000:]


@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


def test_train_with_a_missing_init_checkpoint_names_the_file_and_the_key(dataset: DatasetPaths) -> None:
    missing = dataset.workdir / "runs/synthetic/fc-xe/best.pt"
    proc = caprl("train", dataset.params, "--dataset", "synthetic", "--run", "fc-scst", *dataset.train_args(),
                 "--init", f"model={missing}", "--checkpoint", dataset.workdir / "out/best.pt",
                 "--history", dataset.workdir / "out/history.json", "--state-dir", dataset.workdir / "out/state",
                 cwd=dataset.workdir)
    err = user_error(proc, "train")
    assert f"--init model={missing}: checkpoint not found; params runs.fc-scst.init.model starts this run " \
           "from run fc-xe: train fc-xe on dataset synthetic first" in err
    assert not (dataset.workdir / "out/best.pt").exists()


# -- 4. a killed writer's temporary file -----------------------------------------------------

@pytest.mark.usefixtures("jobs_by_themselves")  # its temporary file is named by the killed process's pid
def test_a_killed_features_job_leaves_a_temporary_file_that_the_rerun_removes(tmp_path: Path) -> None:
    params = merge(default_params(), TINY)
    params["features"]["shards"] = [0]
    params_path = write_params(tmp_path, params)
    (tmp_path / "images").mkdir()
    images = []
    for k in range(4):  # large enough that decoding them takes about a second
        Image.new("RGB", (4000, 4000), (60 * k, 90, 30)).save(tmp_path / "images" / f"{k}.png", compress_level=1)
        images.append({"id": k + 1, "file": f"{k}.png", "split": "train", "captions": [["a", "b"]], "raw": ["a b"]})
    io.write_json(tmp_path / "annotations.json", {"dataset": "synthetic", "images": images})
    out = tmp_path / "features" / "shard0.h5"
    args = ("--dataset", "synthetic", "--annotations", tmp_path / "annotations.json", "--image-root",
            tmp_path / "images", "--shard", "0", "--out", out)
    job = subprocess.Popen(caprl_command("features", params_path, *args), cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline:
        if out.parent.is_dir() and temporaries(out.parent):
            job.send_signal(signal.SIGKILL)  # mid-write, as the OOM killer or a lost node would
            break
        time.sleep(0.002)
    assert job.wait(timeout=60) == -signal.SIGKILL, "the job ended before its temporary file was seen"
    left = temporaries(out.parent)
    assert len(left) == 1 and left[0].startswith(f".shard0.h5.{job.pid}@") and not out.exists()

    proc = caprl("features", params_path, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"removed {out.parent / left[0]}, left by a killed writer of {out}" in proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["shard0.h5"]
    with open_features_file(out) as h5:
        assert h5["image_ids"][:].tolist() == [1, 2, 3, 4]
        pooled = h5["pooled"][:]
    assert np.isfinite(pooled).all() and len({row.tobytes() for row in pooled}) == 4  # four different images


def test_a_temporary_file_of_a_live_writer_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "scores.json"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = io.HOST
        theirs = tmp_path / f".scores.json.{live.pid}@{host}~abcd1234.tmp"
        legacy_old, legacy_new = tmp_path / ".scores.json.k3j_9xqa.tmp", tmp_path / ".scores.json.zz0_abcd.tmp"
        other = tmp_path / ".scores.json.old.1@elsewhere~ab.tmp"  # a temporary file of target "scores.json.old"
        for path in (theirs, legacy_old, legacy_new, other):
            path.write_text("partial")
        os.utime(legacy_old, (time.time() - 2 * io.STALE_AFTER_S,) * 2)
        io.write_json(target, {"run": "x"})
        assert temporaries(tmp_path) == sorted(p.name for p in (theirs, legacy_new, other))
    finally:
        live.kill()
        live.wait()
    io.write_json(target, {"run": "y"})  # its writer is gone now
    assert temporaries(tmp_path) == sorted(p.name for p in (legacy_new, other))
    assert io.read_json(target) == {"run": "y"}


# -- 5. degenerate captions -------------------------------------------------------------------

def test_degenerate_warnings_of_caption_sets() -> None:
    assert degenerate_warnings({i: f"a red circle {i}" for i in range(50)}) == []
    assert degenerate_warnings({1: "a dog"}) == []  # one image: one caption is no sign of anything
    [empty] = degenerate_warnings({1: "", 2: "a dog", 3: "a cat", 4: " "})
    assert empty["kind"] == "empty_captions" and empty["count"] == 2 and empty["fraction"] == 0.5
    [all_empty] = degenerate_warnings({i: "" for i in range(5)})
    assert all_empty["message"] == "every caption is empty (100.0%)"
    [same] = degenerate_warnings({i: "a  dog" for i in range(5)})
    assert same["kind"] == "same_caption" and same["message"].endswith("got the same caption 'a dog'")
    n = int(4 / MIN_DISTINCT_FRACTION)
    [few] = degenerate_warnings({i: ("a dog", "a cat", "a cow")[i % 3] for i in range(n)})
    assert few["kind"] == "few_distinct" and few["distinct"] == 3


def test_degenerate_captions_are_flagged_in_scores_and_tables(dataset: DatasetPaths) -> None:
    work, results = dataset.workdir, dataset.workdir / "results" / "synthetic"
    data = ("--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels", dataset.labels,
            "--features", dataset.features)
    jobs = []
    for run, method, word in (("fc-xe", "xe", "a"), ("fc-scst", "scst", "<eos>")):
        ckpt = degenerate_checkpoint(dataset, run, method, word)
        out = results / run
        jobs.append(caprl_command("evaluate", dataset.params, "--dataset", "synthetic", "--run", run, "--checkpoint",
                                  ckpt, *data, "--refs", dataset.references["test"], "--out-captions",
                                  out / "captions.json", "--out-scores", out / "scores.json", "--out-examples",
                                  out / "examples.json"))
    base = results / "most-frequent"
    jobs.append(caprl_command("baseline", dataset.params, "--dataset", "synthetic", "--annotations",
                              dataset.annotations, "--refs", dataset.references["test"], "--out-captions",
                              base / "captions.json", "--out-scores", base / "scores.json", "--out-examples",
                              base / "examples.json"))
    procs = [subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in jobs]  # side by side, as Snakemake runs them
    logs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], "\n".join(log[-3000:] for log in logs)
    for run, log in zip(("fc-xe", "fc-scst"), logs):
        assert f"WARNING caprl.evaluation.degenerate: {run}: degenerate captions: " in log
    same = io.read_json(results / "fc-xe" / "scores.json")["warnings"]
    assert [w["kind"] for w in same] == ["same_caption"] and "'a a a a" in same[0]["message"]
    empty = io.read_json(results / "fc-scst" / "scores.json")["warnings"]
    assert [(w["kind"], w["count"]) for w in empty] == [("empty_captions", 16)]
    assert "warnings" not in io.read_json(base / "scores.json")  # one caption for all by design: not checked
    assert "degenerate" not in logs[2]

    proc = caprl("tables", dataset.params, "--dataset", "synthetic", "--results-dir", results, "--out-dir",
                 work / "tables", "--table", "main", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (work / "tables" / "synthetic_main.md").read_text()
    assert "| fc (XE) [fc-xe] ⚠ |" in md and "| fc (SCST) [fc-scst] ⚠ |" in md
    assert "| most frequent training caption |" in md and "| lstm3 (XE) [lstm3-xe] |" in md
    assert "⚠ fc-xe: degenerate captions: every one of the 16 test images got the same caption 'a a a" in md
    assert "⚠ fc-scst: degenerate captions: every caption is empty (100.0%)." in md
    assert "fc (XE) [fc-xe] ⚠," in (work / "tables" / "synthetic_main.csv").read_text()
    assert "[fc-xe] \\textsuperscript{!} &" in (work / "tables" / "synthetic_main.tex").read_text().replace(
        "\\_", "_")


def test_all_empty_captions_are_scored_zero_not_crashed() -> None:
    """A collapsed model's empty samples reach the diversity report and SLE's leave-one-out BLEU."""
    import numpy as np

    from caprl.rewards import ReferenceSet, leave_one_out_bleu

    assert ReferenceSet({1: [[], []], 2: [[]]}).run_gid.shape == (0,)
    assert np.array_equal(leave_one_out_bleu([[[], []], [[], []]]), np.zeros((4, 4)))
