"""On CUDA: one training step and one resume of every objective, and one evaluation.

Skipped where CUDA is absent. Each objective trains one short epoch on the tiny synthetic
dataset on the GPU, is stopped by a real SIGTERM after its first step, resumes, and must end
bit-identical to an uninterrupted run (CUDA RNG included); evaluation beam-searches on the GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import TINY, default_params, merge, sigterm_after_step
from pipeline_data import build_dataset

# CAPRL_GPU_TEST_DEVICE=cpu runs the same checks on the CPU (to check the tests themselves here)
DEVICE = os.environ.get("CAPRL_GPU_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")]

DATASET = "synthetic"
RUNS = {
    "fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 1}},
    "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}, "options": {"epochs": 1, "n_samples": 2}},
    "fc-pg_spider": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"},
                     "options": {"epochs": 1, "rollouts": 2, "baseline_warmup_steps": 1}},
    "fc-mixer": {"method": "mixer", "model": "fc", "init": {"model": "fc-xe"}, "options": {"epochs": 1, "m_start": 4}},
    "fc-sll_me": {"method": "sll", "model": "fc", "init": {"model": "fc-xe"},
                  "options": {"epochs": 1, "n_samples": 2, "entropy": 1.0e-2}},
    "fc-sll_sle": {"method": "sll_sle", "model": "fc", "init": {"model": "fc-xe"}, "options": {"epochs": 1, "n_samples": 3}},
    # paper 004: the listener's pre-training, then methods that train it, freeze it, relax the samples
    "listener": {"method": "listener", "model": "fc", "options": {"epochs": 2, "warmup_epochs": 1}},
    "fc-luo2018": {"method": "luo2018", "model": "fc", "init": {"model": "fc-xe", "listener": "listener"},
                   "options": {"epochs": 1, "n_samples": 2}},
    "fc-reinforce_joint": {"method": "reinforce_joint", "model": "fc", "init": {"model": "fc-xe", "listener": "listener"},
                           "options": {"epochs": 1}},
    "fc-psst_gumbel": {"method": "psst_gumbel", "model": "fc", "init": {"model": "fc-xe", "listener": "listener"},
                       "options": {"epochs": 1, "n_samples": 2}},
    "fc-psst_multinomial": {"method": "psst_multinomial", "model": "fc",
                            "init": {"model": "fc-xe", "listener": "listener"}, "options": {"epochs": 1, "rho": 0.5}},
    "fc-psst_multinomial_code": {"method": "psst_multinomial", "model": "fc",  # the authors' code's variant
                                 "init": {"model": "fc-xe", "listener": "listener"},
                                 "options": {"epochs": 1, "rho": 0.5, "variant": "code"}},
    "fc-frozen_speaker": {"method": "frozen_speaker", "model": "fc", "init": {"model": "fc-xe", "listener": "listener"},
                          "options": {"epochs": 1}},
    "fc-value": {"method": "value", "model": "fc", "init": {"model": "fc-xe", "listener": "listener"},
                 "options": {"epochs": 1}},
    "fc-actor_critic": {"method": "actor_critic", "model": "fc",
                        "init": {"model": "fc-xe", "listener": "listener", "value": "fc-value"}, "options": {"epochs": 1}},
    "stackcap-xe": {"method": "xe", "model": "stackcap", "options": {"epochs": 1}},
    "stackcap-c2f": {"method": "c2f", "model": "stackcap", "init": {"model": "stackcap-xe"},
                     "options": {"epochs": 1, "n_samples": 2}},
}


@pytest.fixture(autouse=True)
def tape_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny test models are taped too (caprl.models.timeshared), to run the tapes on the GPU."""
    from caprl.models import timeshared

    monkeypatch.setattr(timeshared, "MIN_TAPED", 0)


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("gpu")
    params = {**merge(default_params(), TINY), "runs": RUNS}
    params["synthetic"]["n_train"] = 40
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    return build_dataset(root / "work", params, env=env), env


def _train(params: dict[str, Any], data: Any, run: str, state: Path, inits: dict[str, str],
           stop_after: int | None = None) -> Path:
    from caprl.data.loader import CaptionData, DataPaths, Loading
    from caprl.training import run as run_mod
    from caprl.training.distributed import Dist
    from caprl.training.loop import Preempted

    # streamed from disk: the pinned-memory read-ahead to the GPU
    loaded = CaptionData(DataPaths(str(data.annotations), str(data.vocab), str(data.labels), str(data.features)),
                         Loading(in_memory=False, prefetch=2))
    dist = Dist(device=torch.device(DEVICE))
    if stop_after is None:
        return run_mod.train(params, DATASET, run, loaded, str(data.cider_df), inits, state, dist)[0]
    with sigterm_after_step(stop_after), pytest.raises(Preempted):
        run_mod.train(params, DATASET, run, loaded, str(data.cider_df), inits, state, dist)
    return run_mod.train(params, DATASET, run, loaded, str(data.cider_df), inits, state, dist)[0]


def _params(gpu_data: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    """The dataset and its params.yaml, with MLflow and the working directory of the dataset."""
    from caprl import params as params_mod

    data, env = gpu_data
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    monkeypatch.chdir(data.workdir)
    return data, params_mod.load(data.params)


def test_every_objective_trains_and_resumes_bit_identically_on_cuda(gpu_data: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.models import checkpoint

    data, params = _params(gpu_data, monkeypatch)
    best: dict[str, Path] = {}
    for run, spec in RUNS.items():
        inits = {role: str(best[source]) for role, source in spec.get("init", {}).items()}
        best[run] = _train(params, data, run, tmp_path / run / "ref", inits)
        resumed = _train(params, data, run, tmp_path / run / "resumed", inits, stop_after=1)
        a, b = checkpoint.load(best[run]), checkpoint.load(resumed)
        assert set(a.modules) == set(b.modules)
        for name in a.modules:
            for key, tensor in a.modules[name].state.items():
                assert torch.equal(tensor, b.modules[name].state[key]), f"{run}: {name}.{key} differs after resume"
        last = checkpoint.load(tmp_path / run / "resumed" / "last.pt")
        assert last.rng is not None and ("cuda" in last.rng) == (DEVICE == "cuda")


def test_bf16_autocast_trains_and_resumes_bit_identically(gpu_data: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.models import checkpoint

    data, params = _params(gpu_data, monkeypatch)
    params["train"]["amp"] = "bf16"
    params["runs"] = {"topdown-xe": {"method": "xe", "model": "topdown", "options": {"epochs": 1}},
                      "topdown-scst": {"method": "scst", "model": "topdown", "init": {"model": "topdown-xe"},
                                       "options": {"epochs": 1, "n_samples": 2}}}
    xe = _train(params, data, "topdown-xe", tmp_path / "xe", {})
    ref = _train(params, data, "topdown-scst", tmp_path / "ref", {"model": str(xe)})
    resumed = _train(params, data, "topdown-scst", tmp_path / "resumed", {"model": str(xe)}, stop_after=1)
    a, b = checkpoint.load(ref).module("model").state, checkpoint.load(resumed).module("model").state
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.dtype == torch.float32 and bool(torch.isfinite(v).all()) for v in a.values())
    history = checkpoint.load(tmp_path / "ref" / "last.pt").position["history"]
    assert all(h["train_loss"] == h["train_loss"] for h in history)  # no NaN loss


def test_evaluation_runs_on_cuda(gpu_data: Any) -> None:
    from caprl.data.loader import CaptionData, DataPaths
    from caprl.evaluation.run import decoded_captions, diversity_sets
    from caprl.models import build_model

    data, _ = gpu_data
    loaded = CaptionData(DataPaths(str(data.annotations), str(data.vocab), str(data.labels), str(data.features)))
    model = build_model("topdown", {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8, "dropout": 0.0},
                        len(loaded.vocab), loaded.feat_dim, loaded.n_regions).to(DEVICE)
    ids = loaded.split_ids("test")
    captions = decoded_captions(model, loaded, ids, "beam", batch_size=7, beam_size=3, max_length=8)
    assert sorted(captions) == sorted(ids)
    assert next(model.parameters()).device.type == DEVICE
    # the diversity decodings (seeded random samples, top beams) on the GPU, twice: the same sets
    from caprl.evaluation.settings import EvalSettings
    from conftest import default_params

    params = default_params()
    params["seed"], params["decode"]["max_length"], params["evaluate"]["batch_size"] = 3, 8, 7
    params["evaluate"]["diversity"].update(samples=3, beams=3, examples=2)
    first, again = (diversity_sets(model, loaded, ids, EvalSettings.from_params(params)) for _ in range(2))
    assert first == again
    assert all(sorted(sets) == sorted(ids) and all(len(c) == 3 for c in sets.values()) for sets in first.values())
