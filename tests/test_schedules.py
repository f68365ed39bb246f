"""What paper-scale recipes need from the trainer: scheduled sampling (self-critical.pytorch's
``scheduled_sampling_*``), and two sizes of one architecture in one configuration."""

from __future__ import annotations

import pytest
import torch

from caprl.models import build_model
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.objectives.xe import XEOptions, sampling_probability
from conftest import default_params
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode


def options(**ss: float) -> XEOptions:
    return XEOptions.from_dict({"lr": 1e-3, "epochs": 30, **CONSTANT_LR, **ss}, "objectives.xe")


def test_sampling_probability_follows_self_critical_pytorchs_schedule() -> None:
    """SCP train.py: if epoch > start >= 0: min(increase_prob * ((epoch - start) // every), max)."""
    scp = options(ss_start=0, ss_increase_every=5, ss_increase_prob=0.05, ss_max_prob=0.25)
    assert [sampling_probability(e, scp) for e in (0, 4, 5, 9, 10, 24, 25, 40)] == \
        [0.0, 0.0, 0.05, 0.05, pytest.approx(0.10), pytest.approx(0.20), 0.25, 0.25]
    assert all(sampling_probability(e, options()) == 0.0 for e in range(50))  # ss_start -1: never
    late = options(ss_start=10, ss_increase_every=2, ss_increase_prob=0.1, ss_max_prob=0.3)
    assert [sampling_probability(e, late) for e in (10, 11, 12, 14, 30)] == \
        [0.0, 0.0, 0.1, pytest.approx(0.2), 0.3]


def model_and_labels() -> tuple[torch.nn.Module, dict, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), FEAT, 3).eval()
    batch = ToyData().batch([0, 1, 2, 3])
    ctx = model.encode(batch.pooled, batch.regions)
    labels = torch.tensor([[1, 2, 3], [1, 2, 5], [1, 4, 3], [1, 4, 5]])  # equal lengths: rows keep their order
    return model, ctx, labels


@pytest.mark.numerics
def test_sampled_inputs_replace_the_gold_words_with_the_given_probability() -> None:
    """p = 0 is teacher forcing; p = 1 feeds, after the start token, a word drawn from the
    previous step's distribution (the generator's draws, as a step-by-step loop makes them); the
    targets stay the gold words; the same generator seed gives the same result."""
    model, ctx, labels = model_and_labels()
    forced = model.token_logprobs(ctx, labels)
    assert torch.equal(model.token_logprobs(ctx, labels, 0.0), forced)
    sampled = model.token_logprobs(ctx, labels, 1.0, torch.Generator().manual_seed(3))
    gold = torch.cat([labels, labels.new_zeros(4, 1)], dim=1)
    generator, state, prev, expected = torch.Generator().manual_seed(3), model.init_state(ctx), None, []
    prev = torch.zeros(4, 1, dtype=torch.long)
    for t in range(gold.shape[1]):
        out = model.step(prev, ctx, state)
        state = out.state
        expected.append(out.logprobs[:, -1].gather(1, gold[:, t:t + 1]).squeeze(1))
        word = torch.multinomial(out.logprobs[:, -1].exp(), 1, generator=generator).squeeze(1)
        use = torch.rand(4, generator=generator) < 1.0
        prev = torch.where(use, word, gold[:, t])[:, None]
    # bit-identical: the sampled path steps these 4 rows (equal lengths, never reordered) as this loop does
    assert torch.equal(sampled[:, -1], torch.stack(expected, dim=1))
    assert not torch.allclose(sampled, forced)
    assert torch.equal(model.token_logprobs(ctx, labels, 1.0, torch.Generator().manual_seed(3)), sampled)
    half = [model.token_logprobs(ctx, labels, 0.5, torch.Generator().manual_seed(k)) for k in range(20)]
    assert any(torch.equal(h[:, :, 1], forced[:, :, 1]) for h in half)  # some rows keep the gold word
    assert any(not torch.allclose(h, forced) for h in half)


def test_xe_samples_only_after_ss_start_and_draws_the_same_on_a_rerun() -> None:
    params = default_params()
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6,
                       extras={"feat_dim": FEAT, "seed": 0, "steps_per_epoch": 1})
    model, _, _ = model_and_labels()
    from caprl.decoding import Noise

    batch = ToyData().batch([0, 1, 2, 3])
    xe_options = {**params["objectives"]["xe"], "ss_start": 0, "ss_increase_every": 1, "ss_increase_prob": 0.5,
                  "ss_max_prob": 0.5}
    xe = build_objective("xe", xe_options, env, model, where="objectives.xe")
    losses = {}
    for step in (0, 3, 3):
        batch.noise = Noise(seed=0, step=step, total=4)
        loss, metrics = xe.loss(model, batch)
        losses.setdefault(step, []).append((float(loss.detach()), metrics.get("ss_prob")))
    assert losses[0][0][1] is None  # epoch 0: not after ss_start
    assert losses[3][0] == losses[3][1] and losses[3][0][1] == 0.5  # epoch 3: sampled, the same draws again
    batch.noise = Noise(seed=0, step=0, total=4)
    forced, _ = build_objective("xe", params["objectives"]["xe"], env, model, where="objectives.xe").loss(model, batch)
    assert float(forced.detach()) == losses[0][0][0]


def test_two_sizes_of_one_architecture_in_one_configuration() -> None:
    """``models:`` names model configurations; two of one ``arch`` at different sizes serve two
    runs of one plan (e.g. a recipe's small and paper-size Show-Tell)."""
    from caprl import params as params_mod
    from caprl.workflow.plan import build_plan

    params = default_params()
    params["models"]["fc_big"] = {**params["models"]["fc"], "hidden_size": 2 * params["models"]["fc"]["hidden_size"]}
    params["runs"] = {"fc-xe": {"method": "xe", "model": "fc"}, "fc_big-xe": {"method": "xe", "model": "fc_big"}}
    params["datasets"]["synthetic_video"]["enabled"] = False
    params["datasets"]["synthetic"].pop("runs", None)
    plan = build_plan(params)
    sizes = {}
    for run in ("fc-xe", "fc_big-xe"):
        spec = params_mod.run_spec(params, run)
        config = {k: v for k, v in params["models"][spec.model].items() if k != "arch"}
        model = build_model(params["models"][spec.model]["arch"], config, 10, FEAT, 3)
        sizes[run] = model.logit.in_features
        assert plan.job("synthetic", run).spec.model == spec.model
    assert sizes["fc_big-xe"] == 2 * sizes["fc-xe"]
