"""Paper 001's equal-budget comparison (configs/claims/001_pg_spider.yaml): MIXER, SCST and
PG-SPIDEr see the same number of sampled captions per image per update, and the same number of
policy epochs. Counted by running each objective, with the claims config's options, on a batch
of images with five gold captions each (as the synthetic set has) and recording the rows of
the decode that draws the sampled captions."""

from __future__ import annotations

import pytest
import torch
import yaml

from caprl import decoding
from caprl.data.batch import Batch
from caprl.decoding import Noise
from caprl.models import build_model
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.params import run_spec
from conftest import REPO
from toy import WORDS, count_red, decode


EQUAL = ("fc_lstm-scst", "fc_lstm-mixer", "fc_lstm-pg_spider-cider_d-equal")
GOLD_PER_IMAGE = 5


def params() -> dict:
    """Paper 001's seed-1 params as its stages read them (the objectives' shared defaults filled in)."""
    from caprl.claims import configs
    from caprl.params import with_objective_defaults

    base = yaml.safe_load((REPO / "params.yaml").read_text())
    config = configs.load_config(configs.config_paths(REPO / "configs" / "claims", ["001"])["001"])
    return with_objective_defaults(configs.seed_params(base, config, 1))


def sampled_rows_per_image(method: str, options: dict, monkeypatch: pytest.MonkeyPatch) -> float:
    """Rows of the first non-greedy decode of one loss (the sampled captions; PG-SPIDEr's
    roll-outs come after it), per image."""
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), 5, 4)
    n_images = 2
    labels = torch.tensor([[1, 2, 3, 0], [1, 2, 5, 0], [1, 4, 3, 0], [1, 4, 5, 0], [1, 2, 3, 3]] * n_images)
    batch = Batch(image_ids=list(range(n_images)), pooled=torch.randn(n_images, 5), regions=torch.randn(n_images, 4, 5),
                  labels=labels, label_image=torch.arange(n_images).repeat_interleave(GOLD_PER_IMAGE),
                  noise=Noise(seed=1, step=10_000, total=n_images))  # past PG-SPIDEr's warm-up and MIXER's schedule
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6,
                       extras={"steps_per_epoch": 24})
    rows: list[int] = []
    real = decoding.rollout

    def spy(model_, at, steps, **kw):
        if not kw.get("greedy"):
            rows.append(at.prev.shape[0])
        return real(model_, at, steps, **kw)

    monkeypatch.setattr(decoding, "rollout", spy)
    options = {**options, "reward": "count_red"}
    build_objective(method, options, env, model).loss(model, batch)
    return rows[0] / n_images


def test_equal_budget_runs_see_equal_sample_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    p = params()
    specs = {run: run_spec(p, run) for run in EQUAL}
    counts = {run: sampled_rows_per_image(s.method, s.options, monkeypatch) for run, s in specs.items()}
    assert counts == {run: 5.0 for run in EQUAL}, counts
    steps_per_epoch = -(-p["synthetic"]["n_train"] // p["train"]["batch_size"])
    warmup_epochs = {run: -(-s.options.get("baseline_warmup_steps", 0) // steps_per_epoch) if s.method == "pg_spider"
                     else 0 for run, s in specs.items()}
    policy_epochs = {run: s.options["epochs"] - warmup_epochs[run] for run, s in specs.items()}
    assert len(set(policy_epochs.values())) == 1, policy_epochs


def test_the_papers_budget_differs_and_says_so() -> None:
    """The paper's comparison keeps each method's own M: PG-SPIDEr samples one caption per image."""
    p = params()
    assert run_spec(p, "fc_lstm-pg_spider-cider_d").options["n_samples"] == 1
    assert run_spec(p, "fc_lstm-pg_spider-cider_d-equal").options["n_samples"] == 5
