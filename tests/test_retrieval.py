"""``caprl retrieval`` (paper 004, sec. 6.2): recall@K of a run's captions by its own listener, and
of a listener run's listener by the first gold captions (``--gold``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from caprl import cli, io
from caprl.models import checkpoint
from caprl.data.loader import CaptionData
from caprl.data.vocab import Vocab
from caprl.errors import CaprlError
from caprl.evaluation import retrieval as stage
from caprl.models import build_model
from caprl.objectives.listener import first_captions, gold_recall
from caprl.retrieval import Listener, ListenerConfig, ranks_of, recall_report
from caprl.workflow.plan import CHECKPOINT, HISTORY, RETRIEVAL, STATE_DIR, build_plan
from conftest import TINY, default_params, merge
from pipeline_data import build_dataset, caprl_command, tiny_files

LISTENER = {"word_size": 8, "hidden_size": 16, "margin": 0.2}


# ---------------------------------------------------------------- ranks and recall


def test_ranks_and_recall_on_a_hand_made_ranking_with_ties() -> None:
    sim = torch.tensor([[0.9, 0.1, 0.2, 0.3],   # own image first: rank 1
                        [0.5, 0.4, 0.4, 0.1],   # one image above, one tied: rank 3 (ties count against)
                        [0.1, 0.2, 0.3, 0.0],   # first: rank 1
                        [0.7, 0.7, 0.7, 0.7]])  # all tied: rank 4
    ranks = ranks_of(sim)
    assert ranks.tolist() == [1, 3, 1, 4]
    report = recall_report(ranks, ks=(1, 3, 10))
    assert report["R@1"] == 0.5 and report["R@3"] == 0.75 and report["R@10"] == 1.0
    assert report["mean_rank"] == pytest.approx(2.25) and report["median_rank"] == 2.0 and report["n_images"] == 4
    assert ranks_of(sim, target=torch.tensor([3, 0, 2, 1])).tolist() == [2, 1, 1, 4]


def small_listener(vocab_size: int = 7, feat_dim: int = 5) -> Listener:
    torch.manual_seed(0)
    return Listener(ListenerConfig.from_dict(LISTENER), vocab_size, feat_dim)


def test_retrieval_ranks_match_the_listener_and_do_not_depend_on_batches() -> None:
    listener = small_listener()
    torch.manual_seed(1)
    image_ids = [10, 11, 12, 13, 14]
    pooled = torch.randn(5, 5)
    captions = {11: [1, 2], 13: [3], 10: [4, 5, 6], 12: [], 14: [2, 2, 2]}  # an empty caption too
    ranks = stage.retrieval_ranks(listener, captions, image_ids, pooled, batch_size=2)
    assert ranks == stage.retrieval_ranks(listener, captions, image_ids, pooled, batch_size=100)
    tokens = stage.token_matrix([captions[i] for i in image_ids])
    with torch.no_grad():
        expected = ranks_of(listener.similarity(tokens, pooled))
    assert [ranks[i] for i in image_ids] == expected.tolist()
    with pytest.raises(CaprlError, match="not among the ranked images"):
        stage.retrieval_ranks(listener, {99: [1]}, image_ids, pooled)


def test_identical_images_tie_against_the_caption() -> None:
    listener = small_listener()
    pooled = torch.ones(3, 5)  # three identical images: every caption ties with all of them
    ranks = stage.retrieval_ranks(listener, {1: [1], 2: [2], 3: [3]}, [1, 2, 3], pooled)
    assert ranks == {1: 3, 2: 3, 3: 3}


def test_token_matrix_ends_every_caption() -> None:
    assert stage.token_matrix([[3, 4], [], [5]]).tolist() == [[3, 4, 0], [0, 0, 0], [5, 0, 0]]


def test_captions_outside_the_vocabulary_are_an_error() -> None:
    vocab = Vocab(["<eos>", "a", "red", "circle", "UNK"], 1, 16)
    got = stage.encode_captions([{"image_id": 3, "caption": "a red circle"}], vocab, "caps.json")
    assert got == {3: [1, 2, 3]}
    with pytest.raises(CaprlError, match="caps.json: image 4: word 'square' is not in the vocabulary"):
        stage.encode_captions([{"image_id": 4, "caption": "a red square"}], vocab, "caps.json")
    with pytest.raises(CaprlError, match="caps.json: expected a list"):
        stage.encode_captions([{"id": 4}], vocab, "caps.json")


# ---------------------------------------------------------------- the stage on a tiny dataset


def tiny_data(tmp_path: Path, n_test: int = 3) -> dict[str, Path]:
    """A generated dataset (3 test images), an xe checkpoint and one with a listener, and the
    test images' first reference captions as captions.json."""
    paths = tiny_files(tmp_path, n_test)
    vocab = Vocab.load(paths["vocab.json"])
    data = CaptionData.from_args(argparse.Namespace(**{k.split(".")[0]: v for k, v in paths.items()}))
    torch.manual_seed(0)
    model = checkpoint.model_record(build_model("fc", {"embed_size": 8, "hidden_size": 16}, len(vocab),
                                                data.feat_dim, data.n_regions), "fc")
    listener = Listener(ListenerConfig.from_dict(LISTENER), len(vocab), data.feat_dim)
    for name, method, modules in [("xe.pt", "xe", {"model": model}),
                                  ("best.pt", "psst_multinomial",
                                   {"model": model, "listener": checkpoint.record_of(listener, "psst.listener",
                                                                                     LISTENER)})]:
        paths[name] = tmp_path / name
        checkpoint.save(paths[name], checkpoint.Checkpoint(run={"method": method}, modules=modules,
                                                           vocab_sha256=vocab.sha256))
    captions = [{"image_id": i, "caption": " ".join(data.vocab.decode(data.labels.captions(i)[0]))}
                for i in data.split_ids("test")]
    paths["captions.json"] = tmp_path / "captions.json"
    io.write_json(paths["captions.json"], captions)
    return paths


def stage_args(paths: dict[str, Path], tmp_path: Path, ckpt: str = "best.pt", **extra: Any) -> argparse.Namespace:
    """The stage's arguments (``--captions captions.json``; ``gold=True, captions=None``: ``--gold``)."""
    return argparse.Namespace(**{
        "dataset": "synthetic", "run": "r", "checkpoint": paths[ckpt], "captions": paths["captions.json"],
        "gold": False, "annotations": paths["annotations.json"], "vocab": paths["vocab.json"],
        "labels": paths["labels.h5"], "features": paths["features.h5"],
        "out": tmp_path / "results" / "retrieval.json", **extra})


def stage_params() -> dict[str, Any]:
    return merge(default_params(), {"listener": LISTENER, "evaluate": {"split": "test", "batch_size": 2}})


def test_report_ranks_every_test_image_with_the_runs_listener(tmp_path: Path) -> None:
    paths = tiny_data(tmp_path)
    report = stage.retrieval_report(stage_params(), stage_args(paths, tmp_path))
    data = CaptionData.from_args(stage_args(paths, tmp_path))
    ids = data.split_ids("test")
    assert {k: report[k] for k in ("run", "dataset", "split", "listener", "captions", "n_images")} == {
        "run": "r", "dataset": "synthetic", "split": "test", "listener": "the run's own", "captions": "generated",
        "n_images": 3}
    ranks = np.array([report["ranks"][str(i)] for i in ids])
    assert set(report["ranks"]) == {str(i) for i in ids} and all(1 <= r <= 3 for r in ranks)
    assert report["R@1"] == pytest.approx((ranks <= 1).mean()) and report["R@10"] == 1.0
    assert report["mean_rank"] == pytest.approx(ranks.mean())
    json.dumps(report)  # JSON-ready


def test_errors_name_the_file(tmp_path: Path) -> None:
    paths = tiny_data(tmp_path)
    with pytest.raises(CaprlError, match=r"xe\.pt holds no listener.*method 'xe' has no listener"):
        stage.retrieval_report(stage_params(), stage_args(paths, tmp_path, ckpt="xe.pt"))
    io.write_json(paths["captions.json"], io.read_json(paths["captions.json"])[:2])
    with pytest.raises(CaprlError, match=r"captions\.json: not the test split's captions \(1 of its 3 images"):
        stage.retrieval_report(stage_params(), stage_args(paths, tmp_path))
    params = stage_params()
    params["listener"] = {**LISTENER, "hidden_size": 32}
    with pytest.raises(CaprlError, match="does not fit params.yaml listener"):
        stage.retrieval_report(params, stage_args(paths, tmp_path))


def test_cli_writes_the_report(tmp_path: Path) -> None:
    """``caprl retrieval`` with a validated params file, as the workflow runs it."""
    paths = tiny_data(tmp_path)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(stage_params(), sort_keys=False))
    args = stage_args(paths, tmp_path)
    argv = ["retrieval", "--params", str(params_file), "--dataset", "synthetic", "--run", "r"]
    for key in ("checkpoint", "captions", "annotations", "vocab", "labels", "features", "out"):
        argv += [f"--{key}", str(getattr(args, key))]
    assert cli.main(argv) == 0
    report = json.loads(args.out.read_text())
    assert report["n_images"] == 3 and sorted(report) == sorted(
        ["run", "dataset", "split", "listener", "captions", "R@1", "R@5", "R@10", "mean_rank", "median_rank",
         "n_images", "ranks"])
    assert [p.name for p in args.out.parent.iterdir()] == ["retrieval.json"]  # no temporary file left


def test_the_sum_of_hinges_counts_every_violating_negative() -> None:
    from caprl.retrieval import vse_hinge, vse_sum_hinge

    sim = torch.tensor([[0.9, 0.1, 0.5], [0.75, 0.8, 0.85], [0.2, 0.6, 0.7]])
    target = torch.arange(3)
    # row 1 (caption of image 1, s = 0.8): images 0 (0.2 - 0.8 + 0.75 = 0.15) and 2 (0.25) both violate;
    # the hardest-negative form keeps only 0.25. Row 0: caption 1 against image 0 (0.2 - 0.9 + 0.75).
    # Row 2: image 1 (0.2 - 0.7 + 0.6 = 0.1) + caption 1 against image 2 (0.2 - 0.7 + 0.85 = 0.35).
    torch.testing.assert_close(vse_sum_hinge(sim, target, 0.2), torch.tensor([0.05, 0.4, 0.45]))
    torch.testing.assert_close(vse_hinge(sim, target, 0.2), torch.tensor([0.05, 0.25, 0.45]))


# ---------------------------------------------------------------- the gold mode (a listener run)


def own_listener(paths: dict[str, Path], data: CaptionData, params: dict[str, Any]) -> Listener:
    return stage.load_listener(paths["best.pt"], params, len(data.vocab), data.feat_dim, data.vocab.sha256)


def test_gold_mode_ranks_as_the_listeners_validation_recall(tmp_path: Path) -> None:
    """``--gold``: each test image's first gold caption ranks the split's images, the caption and the
    listener of ``gold_recall`` (objectives/listener.py) on the same split: the same recall, rank by rank."""
    paths = tiny_data(tmp_path, n_test=12)
    params = stage_params()  # batches of 2 images: the stage's batching does not change a rank
    report = stage.retrieval_report(params, stage_args(paths, tmp_path, captions=None, gold=True))
    data = CaptionData.from_args(stage_args(paths, tmp_path))
    ids = data.split_ids("test")
    listener = own_listener(paths, data, params)
    assert report["captions"] == "gold" and report["split"] == "test" and report["n_images"] == 12
    assert {k: report[k] for k in ("R@1", "R@5", "R@10")} == gold_recall(listener, data, "test")
    batch = data.batch(ids)
    with torch.no_grad():
        expected = ranks_of(listener.eval().similarity(first_captions(batch), batch.pooled))
    assert [report["ranks"][str(i)] for i in ids] == expected.tolist()
    assert len(set(expected.tolist())) > 2  # a ranking that is not trivial (12 images)
    captions, _ = stage.gold_captions(data, ids, 5)
    assert captions[ids[0]] == list(data.labels.captions(ids[0])[0][: len(captions[ids[0]])])  # its first caption
    json.dumps(report)


def test_gold_mode_needs_a_listener_and_exactly_one_caption_source(tmp_path: Path) -> None:
    paths = tiny_data(tmp_path)
    with pytest.raises(CaprlError, match=r"xe\.pt holds no listener"):
        stage.retrieval_report(stage_params(), stage_args(paths, tmp_path, ckpt="xe.pt", captions=None, gold=True))
    for both_or_none in ({"gold": True}, {"captions": None}):
        with pytest.raises(CaprlError, match="exactly one of --captions FILE .* and --gold"):
            stage.retrieval_report(stage_params(), stage_args(paths, tmp_path, **both_or_none))


def cli_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``caprl.cli.main(argv)`` (in this process, whatever ``$CAPRL_JOB_SERVER`` says): its usage error."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_the_cli_takes_captions_or_gold_not_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["retrieval", "--dataset", "synthetic", "--run", "r", "--checkpoint", "c.pt", "--annotations", "a",
              "--vocab", "v", "--labels", "l", "--features", "f", "--out", str(tmp_path / "r.json")]
    assert "one of the arguments --captions --gold is required" in cli_errors(common, capsys)
    assert "argument --gold: not allowed with argument --captions" in cli_errors(
        [*common, "--captions", "c.json", "--gold"], capsys)


# ---------------------------------------------------------------- the gold mode end to end


def test_a_listener_run_through_the_real_stages(tmp_path: Path) -> None:
    """The workflow's commands as subprocesses (params.yaml paths, MLflow on sqlite): the data stages,
    ``caprl train`` of a listener run, ``caprl retrieval --gold`` (its recall is the trained
    listener's ``gold_recall`` on the test split, its MLflow run nested under the training run),
    then ``caprl tables`` showing it in psst_points and psst_table2."""
    from mlflow.tracking import MlflowClient

    n_test = 12
    params = merge(default_params(), TINY)
    params["synthetic"].update(n_train=40, n_val=8, n_test=n_test)
    params["runs"] = {"listener": {"method": "listener", "model": "fc"}}
    params["evaluate"]["batch_size"] = 5
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    data = build_dataset(tmp_path, params, env=env)
    job = build_plan(params).gold_retrieved("synthetic")[0]  # the plan's paths, as the workflow's
    assert job.run == "listener" and job.result(RETRIEVAL) == RETRIEVAL.format(dataset="synthetic", run="listener")
    train_paths = [f.format(dataset="synthetic", run="listener") for f in (CHECKPOINT, HISTORY, STATE_DIR)]
    data_args = data.train_args()[:8]  # annotations, vocab, labels, features

    def run(stage: str, *args: str) -> None:
        cmd = caprl_command(stage, data.params, "--log", f"logs/{stage}.log", *args)
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]

    run("train", "--dataset", "synthetic", "--run", "listener", *data.train_args(), "--checkpoint", train_paths[0],
        "--history", train_paths[1], "--state-dir", train_paths[2])
    run("retrieval", "--dataset", "synthetic", "--run", "listener", "--checkpoint", job.checkpoint, "--gold",
        *data_args, "--out", job.result(RETRIEVAL))
    report = json.loads((tmp_path / job.result(RETRIEVAL)).read_text())
    assert report["captions"] == "gold" and report["run"] == "listener" and report["n_images"] == n_test

    loaded = CaptionData.from_args(argparse.Namespace(annotations=data.annotations, vocab=data.vocab,
                                                      labels=data.labels, features=data.features))
    listener = stage.load_listener(tmp_path / job.checkpoint, params, len(loaded.vocab), loaded.feat_dim,
                                   loaded.vocab.sha256)
    assert {k: report[k] for k in ("R@1", "R@5", "R@10")} == gold_recall(listener, loaded, "test")

    client = MlflowClient(tracking_uri=uri)
    runs = {r.data.tags["caprl.job"]: r for r in client.search_runs(
        [client.get_experiment_by_name(params["tracking"]["experiment"]).experiment_id])}
    train_run, gold_run = runs["synthetic/listener/train"], runs["synthetic/listener/retrieval"]
    assert gold_run.data.tags["mlflow.parentRunId"] == train_run.info.run_id
    assert checkpoint.mlflow_run_id(tmp_path / job.checkpoint) == train_run.info.run_id
    assert gold_run.data.tags["captions"] == "gold" and gold_run.data.metrics["R_at_10"] == report["R@10"]
    assert train_run.data.metrics["test/R_at_5"] == report["R@5"]  # beside its val recall

    out = tmp_path / "results" / "tables"
    for table in ("psst_points", "psst_table2"):
        run("tables", "--dataset", "synthetic", "--table", table, "--results-dir", "results/synthetic",
            "--out-dir", str(out))
    note = (f"Listener listener, the first gold caption of each of the {n_test} test images: "
            f"R@1 {100 * report['R@1']:.1f}%, R@5 {100 * report['R@5']:.1f}%, R@10 {100 * report['R@10']:.1f}% "
            "(an upper reference for the captions' recall).")
    points, table2 = (out / "synthetic_psst_points.md").read_text(), (out / "synthetic_psst_table2.md").read_text()
    assert note in points and note in table2
    assert "| Listener, first gold caption [listener] | — |" in points
