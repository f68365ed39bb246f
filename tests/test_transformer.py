"""The transformer captioner (caprl.models.transformer): its incremental decode against the whole-
sequence teacher-forced forward (greedy, a beam-reordered state, beam search's scores), the cache
(one new position per step, rows dropped by a CPU decode), every one-stage method taking a step on
it, its sizes' checks, its checkpoint, the Noam rate, and on CUDA its captured XE step and decodes."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, fit, toy_trainer

from caprl import decoding
from caprl.errors import CaprlError
from caprl.models import build_model, checkpoint
from caprl.models.base import map_batch
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.objectives.schedules import noam_rate
from caprl.retrieval import ListenerConfig

DEVICE = os.environ.get("CAPRL_GPU_TEST_DEVICE", "cuda")
SIZES = {"num_layers": 2, "d_model": 16, "heads": 2, "d_ff": 32, "max_positions": 17}


def tiny(vocab: int = len(WORDS), dropout: float = 0.0, end_bias: float = 0.0, seed: int = 0) -> Any:
    """A 2-layer transformer; ``end_bias`` added to the end token's logit (negative: long captions)."""
    torch.manual_seed(seed)
    model = build_model("transformer", {**SIZES, "dropout": dropout, "feat_dropout": dropout}, vocab, FEAT, 3)
    with torch.no_grad():
        model.logit.bias[0] += end_bias
    return model


def images(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEAT, generator=gen), torch.randn(n, 3, FEAT, generator=gen)


def stepped(model: Any, ctx: Any, state: Any, inputs: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Step ``model`` through the words ``inputs [N, T]`` (one per step): every step's log-probabilities
    ``[N, T, V]`` and the state after the last."""
    out = []
    for t in range(inputs.shape[1]):
        step = model.step(inputs[:, t : t + 1], ctx, state)
        out.append(step.logprobs[:, 0])
        state = step.state
    return torch.stack(out, dim=1), state


@pytest.mark.numerics
def test_greedy_steps_give_the_teacher_forced_forwards_logprobs() -> None:
    model, *pixels = to_float64(tiny(vocab=9, end_bias=-4.0).eval(), *images(4))  # steps against one pass
    ctx = model.encode(*pixels)
    greedy = decoding.sample(model, ctx, 12, greedy=True).last_stage()  # [4, 12]
    assert int((greedy > 0).sum(1).min()) >= 6  # long captions: the cache fills many slots
    inputs = torch.cat([greedy.new_zeros(4, 1), greedy[:, :-1]], dim=1)
    steps, _ = stepped(model, ctx, model.init_state(ctx), inputs)  # every step's whole distribution
    assert torch.equal(steps.argmax(-1), greedy)
    forced = model.teacher_forcing(ctx, greedy)[:, 0]  # [4, 13, V], one pass under the causal mask
    assert_float64_close(steps, forced[:, :12])


@pytest.mark.numerics
def test_a_beam_reordered_state_steps_as_the_teacher_forced_forward_of_the_spliced_captions() -> None:
    """Rows of a state after s steps reordered as beam search reorders them (rows of the same image),
    then stepped on: each row's log-probabilities are those of its new prefix + continuation."""
    model, k, s = tiny(vocab=9).eval().double(), 3, 4  # steps against one pass: in float64
    ctx = decoding.expand(model.encode(*to_float64(*images(2))), k)  # 6 rows: 3 beams per image
    gen = torch.Generator().manual_seed(5)
    first, then = torch.randint(1, 9, (6, s), generator=gen), torch.randint(1, 9, (6, 5), generator=gen)
    before, state = stepped(model, ctx, model.init_state(ctx), torch.cat([first.new_zeros(6, 1), first[:, :-1]], 1))
    order = torch.tensor([2, 2, 0, 4, 3, 3])  # beam i takes beam order[i]'s prefix (a beam may be taken twice)
    state = map_batch(lambda x: x.index_select(0, order), state)
    after, _ = stepped(model, ctx, state, torch.cat([first[order, -1:], then[:, :-1]], dim=1))
    captions = torch.cat([first[order], then], dim=1)  # [6, 9]
    forced = model.teacher_forcing(ctx, captions)[:, 0]
    assert_float64_close(before[order], forced[:, :s])
    assert_float64_close(after, forced[:, s:9])


@pytest.mark.numerics
def test_every_beams_score_is_its_teacher_forced_logprob() -> None:
    model, *pixels = to_float64(tiny(vocab=9, end_bias=-2.0).eval(), *images(3))  # beam steps against one pass
    ctx = model.encode(*pixels)
    tokens, scores = decoding.beam_search(model, ctx, 4, 10)
    forced = model.teacher_forcing(decoding.expand(ctx, 4), tokens.reshape(12, 10))[:, 0]  # [12, 11, V]
    gold = torch.cat([tokens.reshape(12, 10), tokens.new_zeros(12, 1)], dim=1)
    live = torch.arange(11) <= (gold[:, :10] > 0).sum(1, keepdim=True)  # words + end token (none at full length)
    live[:, 10] &= (gold[:, 9] == 0)
    summed = (forced.gather(-1, gold.unsqueeze(-1)).squeeze(-1) * live).sum(1).view(3, 4)
    assert int((tokens > 0).sum(-1).max()) >= 5
    assert_float64_close(summed, scores)


@pytest.mark.numerics
def test_scheduled_samplings_step_by_step_path_gives_the_one_pass_logprobs() -> None:
    """XE under scheduled sampling steps through the cache as the base class does (captions sorted
    by length, the batch shrinking as they end); with a probability that never samples it gives
    the one-pass forward's numbers."""
    model = tiny().eval().double()  # steps against one pass: in float64
    labels = torch.randint(1, len(WORDS), (5, 7), generator=torch.Generator().manual_seed(3))
    for row, length in enumerate([7, 2, 5, 0, 3]):
        labels[row, length:] = 0
    ctx = model.encode(*to_float64(*images(5)))
    stepwise = model.token_logprobs(ctx, labels, sample_prob=1e-12, generator=torch.Generator().manual_seed(0))
    assert_float64_close(stepwise, model.token_logprobs(ctx, labels))


def test_a_step_projects_only_its_new_word_and_never_the_memory() -> None:
    """The cache: every decode step computes the self-attention keys/values of ONE position (not the
    prefix again), and the cross-attention's keys/values only in encode, once per image."""
    model = tiny(end_bias=-5.0).eval()
    seen: dict[str, list[int]] = {"self": [], "cross": []}
    for layer in model.decoder:
        layer.self_attention.key.register_forward_hook(lambda m, i, o: seen["self"].append(i[0].shape[1]))
        layer.cross_attention.key.register_forward_hook(lambda m, i, o: seen["cross"].append(i[0].shape[0]))
    ctx = model.encode(*images(2))
    assert seen["cross"] == [2, 2]  # the images, not their rows
    decoding.sample(model, ctx, 8, n=3, noise=decoding.Noise(seed=0, step=0, total=2))
    assert seen["self"] == [1] * 16 and seen["cross"] == [2, 2]  # 8 steps x 2 layers, one position each


@pytest.mark.numerics
def test_a_cpu_decode_that_drops_ended_rows_samples_and_trains_as_stepping_every_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """caprl.decoding.live_rows selects rows of the cache, and the dropout masks stay the full batch's.
    The shrunk decode's matrix products have fewer rows (another blocking, another summation order),
    so both decodes run in float64, where that order moves results by ~1e-15 (tests/numerics.py)."""
    from caprl.decoding import live_rows

    model, (pooled, regions) = tiny(vocab=9, dropout=0.3, end_bias=1.0).train(), images(12)
    model, pooled, regions = to_float64(model, pooled, regions)
    runs = []
    for at in (live_rows.SHRINK_AT, -1.0):  # -1: never shrink
        monkeypatch.setattr(live_rows, "SHRINK_AT", at)
        torch.manual_seed(7)
        model.zero_grad(set_to_none=True)
        samples = decoding.sample(model, model.encode(pooled, regions), 10, n=2,
                                  noise=decoding.Noise(seed=2, step=1, total=12))
        loss = (samples.logprobs * samples.mask * torch.linspace(-1, 1, 24).view(24, 1, 1)).sum()
        loss.backward()
        runs.append((samples, loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, loss_a, grads_a), (b, loss_b, grads_b) = runs
    lengths = a.mask.sum(-1)
    assert 0 < float(lengths.min()) < float(lengths.max()) == 10  # some rows end early, some never
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert_float64_close(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert_float64_close(grads_a[name], grads_b[name], msg=name)


# --- every method meant for one-stage models ---------------------------------------------------
BASE = {"lr": 1e-2, "epochs": 1, **CONSTANT_LR}
RL = {**BASE, "n_samples": 2, "reward": "count_red"}
JOINT = {**RL, "lam": 0.5}
RELAXED = {**JOINT, "listener_lr": 1e-2, "tau": 1.0}
VALUE = {**RL, "cider_weight": 0.0, "value_hidden": 8, "value_mlp": [8, 4]}
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "xe": ("xe", BASE),
    "scst": ("scst", {**RL, "temperature": 1.0, "entropy": 0.0}),
    "sll": ("sll", {**RL, "temperature": 1.0, "entropy": 1e-2}),
    "sll_sle": ("sll_sle", {**RL, "n_samples": 3, "temperature": 1.0, "alpha": 0.75, "diversity": "pairwise"}),
    "mixer": ("mixer", {**BASE, "reward": "count_red", "n_samples": 1, "m_start": 2, "m_step": 1,
                        "epochs_per_stage": 1, "baseline_lr": 1e-2, "baseline_hidden": 0}),
    "pg_spider": ("pg_spider", {**BASE, "rollouts": 2, "reward": "count_red", "baseline_lr": 1e-2,
                                "baseline_hidden": 8, "baseline_warmup_steps": 0, "n_samples": 1,
                                "rollout_mode": "policy"}),
    "value": ("value", VALUE),
    "actor_critic": ("actor_critic", {**VALUE, "value_lr": 1e-2}),
    "luo2018": ("luo2018", JOINT),
    "reinforce_joint": ("reinforce_joint", {**JOINT, "listener_lr": 1e-2}),
    "st_gumbel": ("st_gumbel", RELAXED),
    "st_multinomial": ("st_multinomial", RELAXED),
    "psst_gumbel": ("psst_gumbel", {**RELAXED, "rho": 0.5, "variant": "paper"}),
    "psst_multinomial": ("psst_multinomial", {**RELAXED, "rho": 0.5, "variant": "paper"}),
    "psst_multinomial_code": ("psst_multinomial", {**RELAXED, "rho": 0.5, "variant": "code"}),
    "frozen_speaker": ("frozen_speaker", {**BASE, "n_samples": 2}),
}


@pytest.mark.parametrize("case", sorted(METHODS))
def test_every_one_stage_method_takes_an_optimiser_step_on_a_transformer(case: str) -> None:
    """Built from the OBJECTIVES registry on a tiny transformer (dropout on, as trained) and stepped as
    the trainer steps it (one update per turn): finite losses, and every optimiser group moves."""
    from caprl.models import timeshared

    method, options = METHODS[case]
    model = tiny(dropout=0.1, end_bias=-1.0).train()
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6,
                       extras={"listener": ListenerConfig(word_size=8, hidden_size=12, margin=0.2),
                               "feat_dim": FEAT, "seed": 0})
    objective = build_objective(method, options, env, model)
    groups = objective.param_groups(model)
    optimizer = torch.optim.Adam(groups)
    before = [[p.detach().clone() for p in g["params"]] for g in groups]
    batch = ToyData().batch([0, 1, 2, 3])
    batch.noise = decoding.Noise(seed=0, step=0, total=4)
    for turn in objective.turns or (None,):
        timeshared.reset(objective)
        timeshared.reset(model)
        loss, _ = objective.loss(model, batch) if turn is None else objective.turn_loss(model, batch, turn)
        assert bool(torch.isfinite(loss)), (case, turn)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        timeshared.check(model)
        optimizer.step()
    assert groups
    for group, old in zip(groups, before):
        assert any(not torch.equal(p, q) for p, q in zip(group["params"], old)), (case, group.get("name"))


# --- sizes, checkpoint --------------------------------------------------------------------------
@pytest.mark.parametrize("options, key", [({"d_model": 12, "heads": 4}, "d_model"), ({"heads": 0}, "heads"),
                                          ({"dropout": 1.0}, "dropout"), ({"embed_size": 8}, "embed_size")])
def test_bad_sizes_are_errors_naming_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(CaprlError, match=key):
        build_model("transformer", {**SIZES, **options}, 7, FEAT, 3, where="models.transformer")


def test_captions_longer_than_the_cache_are_an_error_in_xe() -> None:
    model = tiny()
    ctx = model.encode(*images(2))
    model.token_logprobs(ctx, torch.ones(2, 16, dtype=torch.long))  # 16 words + end token: 17 slots
    with pytest.raises(CaprlError, match="max_positions is 17"):
        model.token_logprobs(ctx, torch.ones(2, 17, dtype=torch.long))


def test_a_checkpoint_rebuilds_the_same_model(tmp_path: Path) -> None:
    model = tiny(end_bias=-3.0).eval()
    record = checkpoint.model_record(model, "transformer")
    again = checkpoint.model_from_checkpoint(checkpoint.Checkpoint(run={}, modules={"model": record},
                                                                   vocab_sha256="x")).eval()
    assert again.config == model.config and model.config.hidden_size == 16
    ctx = model.encode(*images(3))
    assert torch.equal(decoding.sample(model, ctx, 8, greedy=True).tokens,
                       decoding.sample(again, again.encode(*images(3)), 8, greedy=True).tokens)


# --- the Noam rate ------------------------------------------------------------------------------
def test_noam_is_scps_rate_and_the_trainer_sets_it_before_every_step(tmp_path: Path) -> None:
    assert noam_rate(20000, 512, 20000, 1.0) == pytest.approx(1 / 3200)  # SCP's recipe: its peak, 512^-.5 20000^-.5
    model = tiny()
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    objective = build_objective("xe", {**BASE, "epochs": 3, "lr_schedule": "noam", "noam_warmup": 4,
                                       "noam_factor": 1.0}, env, model)
    trainer = toy_trainer(objective, model, tmp_path, epochs=3)  # 2 steps an epoch
    rates: list[float] = []
    real = trainer.optimizer.step
    def step(*args: Any, **kwargs: Any) -> Any:
        rates.append(float(trainer.optimizer.param_groups[0]["lr"]))
        return real(*args, **kwargs)

    trainer.optimizer.step = step  # type: ignore[method-assign]
    history = fit(trainer)
    # d_model 16, warm-up 4: 16^-0.5 min(s^-0.5, s 4^-1.5) = 0.25 min(s^-0.5, s / 8) at update s = 1..6
    want = [0.03125, 0.0625, 0.09375, 0.125, 0.25 * 5 ** -0.5, 0.25 * 6 ** -0.5]
    assert rates == pytest.approx(want)
    assert [h["lr"] for h in history] == pytest.approx(want[1::2])  # each epoch's last step's


def test_noam_options_are_checked() -> None:
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    for bad, key in (({"noam_warmup": 0}, "noam_warmup"), ({"lr_schedule": "cosine"}, "lr_schedule"),
                     ({"lr_schedule": "noam", "lr_decay_every": 3}, "lr_decay_every")):
        with pytest.raises(CaprlError, match=key):
            build_objective("xe", {**BASE, **bad}, env, tiny(), where="runs.x")
    options = build_objective("scst", {**RL, "temperature": 1.0, "entropy": 0.0, "lr": 2e-3,
                                       "lr_schedule": "noam", "noam_warmup": 4}, env, tiny()).options
    assert options.lr_scale(0, 3, 16) == pytest.approx(0.125 / 2e-3)  # the model group's rate: noam's exactly
    with pytest.raises(CaprlError, match="d_model"):
        options.lr_scale(0, 3, None)  # a model without one (the LSTMs)



def test_adam_takes_the_runs_betas_and_epsilon(tmp_path: Path) -> None:
    """SCP's NoamOpt builds Adam with betas (0.9, 0.98) and eps 1e-9 (misc.py get_std_opt): a run's
    adam_* options reach the trainer's optimiser; the defaults are torch's; nonsense is refused."""
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    model = tiny()
    default = toy_trainer(build_objective("xe", {**BASE, "epochs": 1}, env, model), model, tmp_path / "a", epochs=1)
    assert all(g["betas"] == (0.9, 0.999) and g["eps"] == 1e-8 for g in default.optimizer.param_groups)
    noam = build_objective("xe", {**BASE, "epochs": 1, "adam_beta2": 0.98, "adam_eps": 1e-9}, env, model)
    trainer = toy_trainer(noam, model, tmp_path / "b", epochs=1)
    assert all(g["betas"] == (0.9, 0.98) and g["eps"] == 1e-9 for g in trainer.optimizer.param_groups)
    for bad, key in (({"adam_beta2": 1.0}, "adam_beta2"), ({"adam_beta1": -0.1}, "adam_beta1"),
                     ({"adam_eps": 0.0}, "adam_eps")):
        with pytest.raises(CaprlError, match=key):
            build_objective("xe", {**BASE, **bad}, env, tiny(), where="runs.x")

# --- CUDA graphs ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA (a capture)")
def test_on_cuda_the_xe_step_and_the_decodes_are_captured_and_replay_the_eager_ones() -> None:
    """CAPRL_GPU_TEST_DEVICE=cpu runs the same steps uncaptured (to check the test itself)."""
    from caprl.decoding import captured
    from caprl.objectives.xe import CrossEntropy
    from caprl.training import graphs

    device = torch.device(DEVICE)
    on_cuda = device.type == "cuda"
    models = {"graphed": tiny(dropout=0.0).to(device), "eager": None}
    models["eager"] = copy.deepcopy(models["graphed"])
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    losses: dict[str, list[torch.Tensor]] = {}
    steps: dict[str, Any] = {}
    for name, model in models.items():
        objective = build_objective("xe", BASE, env, model)
        assert isinstance(objective, CrossEntropy)
        groups = [{"params": list(model.parameters()), "lr": 1e-3}]
        optimizer = graphs.capturable_adam(groups, device, None) if on_cuda else torch.optim.Adam(groups)
        steps[name] = graphs.GraphedStep(lambda b, o=objective, m=model: o.fixed_loss(m, b), objective.fixed_step,
                                         optimizer, [list(model.parameters())], 2.0,
                                         capture=on_cuda and name == "graphed", warmup=1)
        losses[name] = []
        for ids in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]):
            out = steps[name].run(ToyData().batch(ids).to(device))
            assert out is not None
            losses[name].append(out[0].clone())
    if on_cuda:
        assert steps["graphed"].graph is not None and not steps["graphed"].failed and steps["graphed"].replays == 3
    torch.testing.assert_close(torch.stack(losses["graphed"]), torch.stack(losses["eager"]), atol=1e-6, rtol=1e-6)
    for (key, p), q in zip(models["graphed"].state_dict().items(), models["eager"].state_dict().values()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=key)
    model = models["graphed"].eval()
    for decode_fn in (lambda c: decoding.greedy_decoder(model, c, 6),
                      lambda c: decoding.top_k_beams_decoder(model, c, 6, beam_size=3, n=3)):
        for n in (4, 4, 3):  # a capture, a replay, another shape
            with torch.no_grad():
                ctx = model.encode(*(t.to(device) for t in images(n, seed=n)))
                got = decode_fn(ctx)
                captured.set_enabled(False)
                try:
                    want = decode_fn(ctx)
                finally:
                    captured.set_enabled(True)
            assert torch.equal(got, want)
    if on_cuda:
        assert len(captured._graphs[model]) == 4 and captured._FAILED not in captured._graphs[model].values()
