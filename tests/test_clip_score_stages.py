"""CLIP-S in the workflow: what the plan gives the evaluate and train jobs (a listener run's
checkpoint, the raw images), the score file's and the main table's CLIP-S (listener) through the
real stages, and a short SCST run rewarded by the listener's CLIP-S raising it on the toy data."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from caprl import decoding
from caprl.data.loader import CaptionData
from caprl.errors import CaprlError
from caprl.evaluation.retrieval import load_listener
from caprl.metrics.clip_score import ClipScorer, corpus_scores
from caprl.metrics.embeddings import ListenerEmbedding
from caprl.models import build_model
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.retrieval import Listener, ListenerConfig
from caprl.rewards import build_reward
from caprl.workflow import plan as wp
from caprl.workflow.dvc import dvc_stages
from conftest import TINY, default_params, merge, two_dataset_params
from pipeline_data import build_dataset, caprl_command
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, decode, greedy_reward_gain

CLIP_S_RUN = {"method": "scst", "model": "fc", "options": {"reward": "clip_s"}}  # the run entry to add: fc-scst-clip_s


def test_the_plan_gives_evaluations_and_clip_s_rewards_their_embeddings_input() -> None:
    """Evaluations on the synthetic set read the `listener` run's checkpoint; a dataset with
    embedding clip its raw images; embedding none nothing. A run rewarded by clip_s reads the
    listener too (its settings include listener:), in Snakemake's and DVC's commands alike."""
    params = two_dataset_params()
    params["datasets"]["shapes_b"]["clip_score"] = {"embedding": "clip"}
    params["runs"]["fc-scst-clip_s"] = {**CLIP_S_RUN, "init": {"model": "fc-xe"}}
    plan = wp.build_plan(params)
    listener = "runs/synthetic/listener/best.pt"
    assert plan.evaluate_embedding("synthetic") == {"--embedding-listener": listener}
    assert plan.evaluate_embedding("shapes_b") == {"--media-root": "data/raw/shapes_b/images"}
    job = plan.job("synthetic", "fc-scst-clip_s")
    assert plan.train_embedding(job) == {"--embedding-listener": listener}
    assert plan.train_embedding(plan.job("synthetic", "fc-scst")) == {}
    assert {"listener", "rewards.clip_s"} <= set(job.settings_keys(plan.params))
    stages = dvc_stages(plan)
    for stage in ("synthetic-train-fc-scst-clip_s", "synthetic-evaluate-fc-xe"):
        assert stages[stage]["cmd"].endswith(f" --embedding-listener {listener}") and listener in stages[stage]["deps"]
    assert stages["shapes_b-evaluate-fc-xe"]["cmd"].endswith(" --media-root data/raw/shapes_b/images")
    assert "datasets.shapes_b.clip_score" in stages["shapes_b-evaluate-fc-xe"]["params"]
    params["datasets"]["shapes_b"]["clip_score"] = {"embedding": "none"}
    assert wp.build_plan(params).evaluate_embedding("shapes_b") == {}


def test_a_clip_s_reward_needs_its_listener_run_on_the_dataset() -> None:
    params = merge(default_params(), TINY)
    params["runs"] = {"fc-xe": {"method": "xe", "model": "fc"}, "fc-scst-clip_s": CLIP_S_RUN}
    with pytest.raises(CaprlError, match=r"rewards\.clip_s\.listener: run fc-scst-clip_s is rewarded by CLIP-S in the "
                                         r"listener of run 'listener', which does not train on dataset synthetic"):
        wp.build_plan(params)
    assert wp.build_plan({**params, "runs": {"fc-xe": params["runs"]["fc-xe"]}}).evaluate_embedding("synthetic") == {}


@pytest.mark.numerics
def test_score_file_and_main_table_carry_clip_s_listener_through_the_real_stages(tmp_path: Path) -> None:
    """The workflow's commands (the plan's embedding arguments): a listener run, an SCST run rewarded by
    its CLIP-S (``--embedding-listener``), the run's evaluation, whose score file's ``clip_score``
    is the listener's CLIP-S and RefCLIP-S of its captions, and the main table's columns."""
    params = merge(default_params(), TINY)
    params["synthetic"].update(n_train=60, n_val=6, n_test=12)
    params["evaluate"]["metrics"] = ["bleu", "cider_d"]
    # a listener whose cosines are not all below 0 (30 images, or fewer epochs: every one is, CLIP-S 0)
    params["objectives"]["listener"].update(epochs=10, warmup_epochs=3)
    params["runs"] = {"listener": {"method": "listener", "model": "fc"}, "fc-scst-clip_s": CLIP_S_RUN}
    params["tables"] = ["main"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    data = build_dataset(tmp_path, params, references=["test"], env=env)
    plan = wp.build_plan(params)
    job = plan.job("synthetic", "fc-scst-clip_s")
    embedding = plan.evaluate_embedding("synthetic")
    assert plan.train_embedding(job) == embedding == {"--embedding-listener": "runs/synthetic/listener/best.pt"}

    def run(stage: str, *args: str) -> None:
        cmd = caprl_command(stage, data.params, "--log", f"logs/{stage}.log", *args)
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]

    for name in ("listener", "fc-scst-clip_s"):
        trained = plan.job("synthetic", name)
        run("train", "--dataset", "synthetic", "--run", name, *data.train_args(), "--checkpoint", trained.checkpoint,
            "--history", trained.history, "--state-dir", trained.state_dir, *trained.init_args().split(),
            *wp.embedding_args(plan.train_embedding(trained)).split())
    run("evaluate", "--dataset", "synthetic", "--run", job.run, "--checkpoint", job.checkpoint,
        *data.train_args()[:8], "--refs", str(data.references["test"]), "--out-captions", job.result(wp.CAPTIONS),
        "--out-scores", job.result(wp.SCORES), "--out-examples", job.result(wp.EXAMPLES),
        *wp.embedding_args(embedding).split())
    scores = json.loads((tmp_path / job.result(wp.SCORES)).read_text())
    section = scores["clip_score"]
    assert {k: section[k] for k in ("label", "embedding", "listener", "w")} == {
        "label": "CLIP-S (listener)", "embedding": "listener", "listener": "listener", "w": 2.5}

    loaded = CaptionData.from_args(argparse.Namespace(annotations=data.annotations, vocab=data.vocab,
                                                      labels=data.labels, features=data.features))
    listener = load_listener(tmp_path / "runs/synthetic/listener/best.pt", params, len(loaded.vocab),
                             loaded.feat_dim, loaded.vocab.sha256)
    scorer = ClipScorer(ListenerEmbedding(listener, loaded.vocab.encode,
                                          lambda ids: loaded.features_of(ids, regions=False)[0]), 2.5, 4)
    captions = {e["image_id"]: e["caption"].split() for e in json.loads((tmp_path / job.result(wp.CAPTIONS)).read_text())}
    # the stage's batches against these (other kernels), in float32 (ListenerEmbedding's): not derived
    assert section["metrics"] == pytest.approx(corpus_scores(scorer, captions, loaded.references("test")), abs=1e-6)
    assert section["metrics"]["CLIP-S"] > 0 and section["metrics"]["RefCLIP-S"] > 0  # numbers, not the floor

    run("tables", "--dataset", "synthetic", "--table", "main", "--results-dir", "results/synthetic",
        "--out-dir", "results/tables")
    table = (tmp_path / "results/tables/synthetic_main.csv").read_text().splitlines()
    header, row = table[0].split(","), next(line for line in table if "fc-scst-clip_s" in line).split(",")
    for metric in ("CLIP-S", "RefCLIP-S"):
        assert float(row[header.index(f"{metric} (listener)")]) == pytest.approx(100 * section["metrics"][metric],
                                                                                 abs=0.05)


def test_scst_rewarded_by_the_listeners_clip_s_raises_it_on_the_toy_data() -> None:
    """60 SCST steps (4 samples per image, Adam 1e-2) on the 16 toy train images with reward
    ``clip_s`` in a toy listener's embedding: the greedy captions' CLIP-S (listener) rises, on the
    trained images and on the 8 held-out val images."""
    torch.manual_seed(0)
    listener = Listener(ListenerConfig(word_size=8, hidden_size=12, margin=0.2), len(WORDS), FEAT).eval()
    index = {w: i for i, w in enumerate(WORDS)}
    embedding = ListenerEmbedding(listener, lambda words: [index[w] for w in words],
                                  lambda ids: ToyData().features_of(ids, regions=False)[0])
    refs = {**ToyData().references("train"), **ToyData().references("val")}
    reward = build_reward("clip_s", refs, None, lambda spec: embedding, embedding="listener", listener="listener",
                          model="openai/clip-vit-base-patch32", prompt="A photo depicts", w=2.5)
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0, "cell": "lstm"}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: reward, max_length=6)
    objective = build_objective("scst", {"lr": 1e-2, "epochs": 1, **CONSTANT_LR, "n_samples": 4, "reward": "clip_s",
                                         "temperature": 1.0, "entropy": 0.0}, env, model)

    def val_clip_s() -> float:
        ids = ToyData().split_ids("val")
        batch = ToyData().batch(ids)
        model.eval()
        with torch.no_grad():
            tokens = decoding.sample(model, model.encode(batch.pooled, batch.regions), 6, greedy=True).last_stage()
        return float(reward(ids, decode(tokens)).mean())

    before = val_clip_s()
    first, last = greedy_reward_gain(objective, model, ToyData().batch(ToyData().split_ids("train")), steps=60)
    after = val_clip_s()
    assert last > first + 0.2 and after > before + 0.2, (first, last, before, after)
    assert max(last, after) <= 2.5  # CLIP-S is at most w
