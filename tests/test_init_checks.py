"""What a run asks of its caption model, refused before anything runs (issue 55, sections 5 and 6).

The plan (``caprl plan``, ``snakemake -n``, ``caprl dvc-yaml``: caprl.workflow.plan.build_plan) and
``caprl train`` refuse, in the same words (caprl.models.compat), a Transformer run whose captions
reach its ``max_positions`` and an ``init.model`` of another architecture; and ``caprl train``
builds its reward (a clip_s reward's CLIP) before it writes anything, so one that cannot load
leaves no checkpoint and no MLflow run. The stage tests run the real ``caprl train`` on the TINY
synthetic set and read its one-line error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from caprl.data.feature_store import open_features_file
from caprl.data.vocab import Vocab
from caprl.errors import CaprlError
from caprl.models import build_model, checkpoint
from caprl.workflow import plan as wp
from conftest import TINY, default_params, merge
from pipeline_data import DatasetPaths
from stage_inputs import caprl, degenerate_checkpoint, user_error, write_params

TRANSFORMER_XE = {"method": "xe", "model": "transformer"}


def transformer_params(**runs: dict[str, Any]) -> dict[str, Any]:
    params = merge(default_params(), TINY)
    params["runs"] = {"transformer-xe": TRANSFORMER_XE, **runs}
    return params


def length_message(key: str, length: int, positions: int) -> str:
    return (f"runs.transformer-xe: {key} is {length}, which reaches models.transformer.max_positions ({positions}): "
            f"the Transformer's decode cache holds {positions} positions, and a caption of {length} tokens with its "
            f"end token needs {length + 1}; set models.transformer.max_positions to at least {length + 1}, or "
            f"{key} to at most {positions - 1}")


def test_the_plan_refuses_a_transformer_whose_decode_length_reaches_its_positions() -> None:
    params = transformer_params()
    positions = params["models"]["transformer"]["max_positions"]
    params["decode"]["max_length"] = positions - 1  # the words and the end token fit
    assert ("synthetic", "transformer-xe") in wp.build_plan(params).jobs
    params["decode"]["max_length"] = positions
    with pytest.raises(CaprlError) as raised:
        wp.build_plan(params)
    assert str(raised.value) == length_message("decode.max_length", positions, positions)


@pytest.mark.parametrize("own", [False, True])
def test_the_plan_refuses_a_transformer_whose_gold_captions_reach_its_positions(own: bool) -> None:
    """The vocabulary's max_length (XE's gold captions): params' vocab:, or the dataset's own."""
    params = transformer_params()
    params["models"]["transformer"]["max_positions"] = 14
    params["decode"]["max_length"] = 13
    if own:
        params["datasets"]["synthetic"]["vocab"] = {"max_length": 14}
    else:
        params["vocab"]["max_length"] = 14
    key = "datasets.synthetic.vocab.max_length" if own else "vocab.max_length"
    with pytest.raises(CaprlError) as raised:
        wp.build_plan(params)
    assert str(raised.value) == length_message(key, 14, 14)


def test_other_architectures_have_no_position_limit() -> None:
    params = merge(default_params(), TINY)
    params["runs"] = {"topdown-xe": {"method": "xe", "model": "topdown"}}
    params["decode"]["max_length"] = 40
    assert ("synthetic", "topdown-xe") in wp.build_plan(params).jobs


def test_the_plan_refuses_an_init_run_of_another_architecture() -> None:
    params = transformer_params(**{"topdown-scst": {"method": "scst", "model": "topdown",
                                                    "init": {"model": "transformer-xe"}}})
    with pytest.raises(CaprlError) as raised:
        wp.build_plan(params)
    assert str(raised.value) == (
        "runs.topdown-scst.init.model: run transformer-xe trains a transformer caption model and run topdown-scst a "
        "topdown: the weights of one architecture cannot start another; start run topdown-scst from a run of a "
        "topdown model (e.g. its xe run), or drop init.model to train it from scratch")
    params["runs"]["topdown-xe"] = {"method": "xe", "model": "topdown"}
    params["runs"]["topdown-scst"]["init"] = {"model": "topdown-xe"}
    assert ("synthetic", "topdown-scst") in wp.build_plan(params).jobs


# -- the training stage: refused before it writes ------------------------------------------------

@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


def train(dataset: DatasetPaths, params: Path, run: str, out: Path, *args: Any) -> Any:
    return caprl("train", params, "--dataset", "synthetic", "--run", run, *dataset.train_args(), *args,
                 "--checkpoint", out / "best.pt", "--history", out / "history.json", "--state-dir", out / "state",
                 cwd=dataset.workdir)


def written_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_train_refuses_a_transformer_whose_decode_length_reaches_its_positions(dataset: DatasetPaths) -> None:
    work = dataset.workdir / "positions"
    params = yaml.safe_load(dataset.params.read_text())
    params["runs"]["transformer-xe"] = TRANSFORMER_XE
    params["models"]["transformer"]["max_positions"] = 12  # decode.max_length 16 (and the vocabulary's) reach it
    err = user_error(train(dataset, write_params(work, params), "transformer-xe", work / "out"), "train")
    assert err.endswith(length_message("decode.max_length", params["decode"]["max_length"], 12))
    assert written_files(work / "out") == []


def transformer_checkpoint(dataset: DatasetPaths, path: Path) -> Path:
    """A real best.pt of a transformer-xe run on the dataset (its vocabulary and features)."""
    vocab = Vocab.load(dataset.vocab)
    with open_features_file(dataset.features) as h5:
        feat_dim, n_regions = int(h5.attrs["dim"]), int(h5.attrs["n_regions"])
    options = {k: v for k, v in yaml.safe_load(dataset.params.read_text())["models"]["transformer"].items()
               if k != "arch"}
    model = build_model("transformer", options, len(vocab), feat_dim, n_regions)
    checkpoint.save(path, checkpoint.Checkpoint(run={"name": "transformer-xe", "dataset": "synthetic", "method": "xe",
                                                     "model": "transformer", "options": {}, "init": {}},
                                                modules={"model": checkpoint.model_record(model, "transformer")},
                                                vocab_sha256=vocab.sha256))
    return path


def test_train_refuses_a_transformers_checkpoint_as_an_fc_runs_start(dataset: DatasetPaths) -> None:
    """The loader's words: the file, the run that wrote it, both architectures (no torch size mismatch)."""
    work = dataset.workdir / "other-arch"
    work.mkdir()
    start = transformer_checkpoint(dataset, work / "transformer.pt")
    err = user_error(train(dataset, dataset.params, "fc-scst", work / "out", "--init", f"model={start}"), "train")
    assert err.endswith(
        f"{start}: runs.fc-scst.init.model: run transformer-xe trains a transformer caption model and run fc-scst a "
        "fc: the weights of one architecture cannot start another; start run fc-scst from a run of a fc model "
        "(e.g. its xe run), or drop init.model to train it from scratch")
    assert written_files(work / "out") == []


@pytest.mark.usefixtures("jobs_by_themselves")  # HF_HUB_OFFLINE is read when huggingface_hub is imported
def test_a_clip_s_reward_that_cannot_load_clip_fails_before_the_run_writes_anything(
        dataset: DatasetPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLIP by a name in no local cache, offline: the job fails at once, naming the model and what to do;
    no state, no checkpoint, no MLflow run (built at its first step, the reward left best.pt and last.pt)."""
    work = dataset.workdir / "clip-offline"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    params = yaml.safe_load(dataset.params.read_text())
    params["rewards"]["clip_offline"] = {"kind": "clip_s", "embedding": "clip", "model": "caprl-tests/no-such-clip",
                                         "listener": "listener", "prompt": "A photo depicts", "w": 2.5}
    # from an init, so that it would save its start before its first step (a start without Adam's state: fresh)
    params["runs"]["fc-scst-clip"] = {"method": "scst", "model": "fc", "init": {"model": "fc-xe"},
                                      "options": {"reward": "clip_offline", "init_optimizer": "fresh"}}
    start = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", work / "fc-xe.pt")
    media = dataset.workdir / params["datasets"]["synthetic"]["media_root"]
    assert media.is_dir()
    proc = train(dataset, write_params(work, params), "fc-scst-clip", work / "out", "--init", f"model={start}",
                 "--media-root", media)
    err = user_error(proc, "train")
    assert "cannot load CLIP 'caprl-tests/no-such-clip' (" in err
    assert proc.stderr.rstrip().endswith("run once with internet access (transformers caches the weights under "
                                         "$HF_HOME) or copy the Hugging Face cache to this machine")  # after hub's text
    assert written_files(work / "out") == []
    assert not (work / "mlflow.db").exists()
    assert torch.load(start, weights_only=True)["run"]["name"] == "fc-xe"  # its start left as it was
