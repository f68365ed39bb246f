"""What the stage tests share: a stage run as the workflow runs it, its one-line error, and
real checkpoints and parameter files made for it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import torch
import yaml

from caprl.models import checkpoint
from caprl.data.vocab import Vocab
from caprl.data.feature_store import open_features_file
from caprl.models import build_model
from conftest import TINY, default_params, merge
from pipeline_data import DatasetPaths, build_dataset, caprl_command


#: the words the plan and ``caprl evaluate`` refuse lookahead decoding of an xe run in (caprl.objectives.run_checks)
LOOKAHEAD_ON_XE = ("runs.fc-xe.decode.method: lookahead decoding needs a value network, which method xe of run "
                   "fc-xe does not train (only actor_critic runs have one): decode it with greedy or beam")


def caprl(stage: str, params: Path, *args: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(caprl_command(stage, params, *args), cwd=cwd, capture_output=True, text=True, timeout=120)


def user_error(proc: subprocess.CompletedProcess[str], stage: str) -> str:
    """The one-line error of a stage that failed on its input (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"caprl {stage}: error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def write_params(workdir: Path, params: dict[str, Any]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path



def degenerate_checkpoint(dataset: DatasetPaths, run: str, method: str, word: str, path: Path | None = None) -> Path:
    """An fc model whose every step says ``word`` (``<eos>``: nothing), as a real checkpoint of
    run ``run`` (at ``path``, default the run's place under runs/)."""
    vocab = Vocab.load(dataset.vocab)
    with open_features_file(dataset.features) as h5:
        feat_dim, n_regions = int(h5.attrs["dim"]), int(h5.attrs["n_regions"])
    options = {k: v for k, v in yaml.safe_load(dataset.params.read_text())["models"]["fc"].items() if k != "arch"}
    model = build_model("fc", options, len(vocab), feat_dim, n_regions)
    with torch.no_grad():
        model.logit.weight.zero_()
        model.logit.bias.fill_(-10.0)
        model.logit.bias[vocab.encode([word])[0]] = 10.0
    path = path or dataset.workdir / "runs" / "synthetic" / run / "best.pt"
    checkpoint.save(path, checkpoint.Checkpoint(run={"name": run, "dataset": "synthetic", "method": method,
                                                     "model": "fc", "options": {}, "init": {}},
                                                modules={"model": checkpoint.model_record(model, "fc")},
                                                vocab_sha256=vocab.sha256))
    return path


def research_dataset(workdir: Path) -> DatasetPaths:
    """The TINY synthetic set through the real stages, with its test references."""
    params = merge(default_params(), TINY)
    # its inits are degenerate_checkpoint's, made by hand: no Adam to carry (init_optimizer's default)
    params["runs"]["fc-scst"] = {"method": "scst", "model": "fc", "init": {"model": "fc-xe"},
                                 "options": {"init_optimizer": "fresh"}}
    params["evaluate"]["metrics"] = ["bleu", "cider_d"]
    params["features"]["shards"] = [0]
    return build_dataset(workdir, params, references=["test"])
