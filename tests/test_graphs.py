"""The whole XE step as a CUDA graph (caprl.training.graphs): its fixed-shape loss equals the
shrinking one on every architecture; the graphed step's plumbing (static inputs, the warm-up
steps, batches of other shapes, rates written in place) trains as the eager step does on a CPU;
on CUDA the captured step replays the eager numbers and resumes bit-identically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import sigterm_after_step
from numerics import FLOAT64_TOL, assert_float64_close, to_float64
from toy import CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, fit, snapshot, toy_trainer

from caprl import decoding
from caprl.models import MODELS, build_model, timeshared
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.training import graphs
from caprl.training.distributed import Dist
from caprl.training.loop import Preempted

SIZES = {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8,
         "num_layers": 2, "d_model": 16, "heads": 2, "d_ff": 32}  # each architecture takes those it has
DEVICE = os.environ.get("CAPRL_GPU_TEST_DEVICE", "cuda")


def model_of(arch: str, dropout: float = 0.0, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    fields = MODELS.get(arch).config_class.__dataclass_fields__
    options = {k: v for k, v in {**SIZES, "dropout": dropout, "feat_dropout": dropout}.items() if k in fields}
    return build_model(arch, options, len(WORDS), FEAT, 3)


def xe(model: Any, **options: Any) -> Any:
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    return build_objective("xe", {"lr": 1e-2, "epochs": 2, **CONSTANT_LR, **options}, env, model)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_the_fixed_shape_loss_is_the_shrinking_one(arch: str) -> None:
    """Fixed shapes against a batch that shrinks as captions end (other matmul shapes): in float64."""
    model = model_of(arch).double()
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(1, len(WORDS), (7, 6), generator=gen)
    for row, length in enumerate([6, 0, 3, 1, 5, 2, 4]):  # every length, padding after each caption's end
        labels[row, length:] = 0
    ctx = model.encode(*to_float64(torch.randn(7, FEAT, generator=gen), torch.randn(7, 3, FEAT, generator=gen)))
    want = model.token_logprobs(ctx, labels)
    got = model.token_logprobs_fixed(ctx, labels)
    assert got.shape == want.shape
    assert_float64_close(got, want)
    batch = to_float64(ToyData().batch([0, 1, 2, 5]))
    objective = xe(model)
    (loss, metrics), (fixed, tensors) = objective.loss(model, batch), objective.fixed_loss(model, batch)
    assert_float64_close(fixed, loss)
    assert set(tensors) == set(metrics) and all(abs(float(tensors[k]) - metrics[k]) < FLOAT64_TOL for k in metrics)


def test_scheduled_sampling_and_methods_with_host_rewards_step_eagerly() -> None:
    from caprl.decoding import Noise
    from caprl.objectives import Objective

    model = model_of("fc")
    batch = ToyData().batch([0, 1])
    sampled = xe(model, ss_start=0, ss_increase_every=1)
    assert sampled.fixed_step(batch)  # epoch 0: no sampling yet
    batch.noise = Noise(seed=0, step=3, total=2)  # epoch 3 (1 step an epoch): sampling
    assert not sampled.fixed_step(batch)
    step = graphs.GraphedStep(lambda b: sampled.fixed_loss(model, b), sampled.fixed_step,
                              torch.optim.Adam(model.parameters()), [list(model.parameters())], 2.0, capture=False)
    assert step.run(batch) is None and step.eager_steps == 0  # the trainer steps it eagerly
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=6)
    scst = build_objective("scst", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": 2, "reward": "cider_d",
                                    "temperature": 1.0, "entropy": 0.0}, env, model)
    assert type(scst).fixed_step is Objective.fixed_step and not scst.fixed_step(batch)


def _graphed_trainer(model: Any, state_dir: Path, dist: Any = None, capture: bool = False, **kwargs: Any) -> Any:
    """A toy trainer whose steps go through a GraphedStep (captured only where ``capture``: CUDA)."""
    objective = xe(model, epochs=3)
    trainer = toy_trainer(objective, model, state_dir, epochs=3, dist=dist, cuda_graphs=capture, **kwargs)
    if trainer.graphed is None:  # on a CPU the trainer never graphs: the same step, uncaptured
        trainer.graphed = graphs.graphed_step(objective, model, trainer.optimizer, trainer.clipped, 2.0,
                                              torch.device("cpu"))
    return trainer


@pytest.mark.numerics
def test_the_graphed_steps_plumbing_trains_as_the_eager_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU (nothing captured): static inputs, a rate decay written in place, and the last,
    smaller batch of each epoch (another shape) stepped eagerly; the same losses and weights. The
    graphed step's loss is the fixed-shape one (other matmul shapes): both trainers run in float64."""
    features_of = ToyData.features_of
    monkeypatch.setattr(ToyData, "features_of", lambda self, *args: to_float64(*features_of(self, *args)))
    eager_model, graphed_model = model_of("topdown").double(), model_of("topdown").double()
    eager = toy_trainer(xe(eager_model, epochs=3, lr_decay_every=1, lr_decay_rate=0.5), eager_model,
                        tmp_path / "eager", epochs=3, batch_size=6)
    graphed = _graphed_trainer(graphed_model, tmp_path / "graphed", batch_size=6)
    graphed.objective.options.lr_decay_every, graphed.objective.options.lr_decay_rate = 1, 0.5
    # as capturable_adam makes it, in float64 here: a float32 rate is 1e-2 (1 - 2e-8), a difference of its own
    graphed.optimizer.param_groups[0]["lr"] = torch.tensor(1e-2, dtype=torch.float64)
    a, b = fit(eager), fit(graphed)
    assert graphed.graphed.eager_steps == 6  # 2 full batches of 6 per epoch; the 4-image ones stepped eagerly
    assert isinstance(graphed.optimizer.param_groups[0]["lr"], torch.Tensor)
    assert float(graphed.optimizer.param_groups[0]["lr"]) == pytest.approx(1e-2 * 0.25)
    for x, y in zip(a, b):
        assert x["lr"] == y["lr"]
        assert_float64_close(torch.tensor(y["step_losses"], dtype=torch.float64),
                             torch.tensor(x["step_losses"], dtype=torch.float64))
    for key, value in snapshot(eager_model).items():
        if key.endswith("attention.score.bias"):  # a softmax ignores it: its gradient is rounding noise,
            continue                              # which Adam scales up to +-lr either way
        assert_float64_close(graphed_model.state_dict()[key], value, msg=key)


def test_a_checkpoint_holds_float_rates(tmp_path: Path) -> None:
    model = model_of("fc")
    trainer = _graphed_trainer(model, tmp_path)
    trainer.optimizer.param_groups[0]["lr"] = torch.tensor(3e-3)
    state = graphs.plain_state_dict(trainer.optimizer)
    assert state["param_groups"][0]["lr"] == pytest.approx(3e-3) and isinstance(state["param_groups"][0]["lr"], float)
    assert isinstance(trainer.optimizer.param_groups[0]["lr"], torch.Tensor)  # the live group keeps its tensor


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available(), reason="needs CUDA (a capture)")
def test_on_cuda_the_captured_step_replays_the_eager_step_and_resumes_bit_identically(tmp_path: Path) -> None:
    dist = Dist(device=torch.device("cuda"))
    runs = {}
    for name, capture in (("eager", False), ("graphed", True)):
        model = model_of("topdown", dropout=0.5).cuda()
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        trainer = _graphed_trainer(model, tmp_path / name, dist=dist, capture=capture)
        if capture:
            assert trainer.graphed is not None and trainer.graphed.capture
            trainer.graphed.warmup = 1
        else:
            trainer.graphed.capture = False
        history = fit(trainer)
        runs[name] = (history, snapshot(model), trainer.graphed)
    assert runs["graphed"][2].graph is not None and runs["graphed"][2].replays >= 4
    # validation after replays decodes with the new weights (a replay's Adam step runs no hook: the
    # cached joined weights of caprl.models.timeshared are made again)
    graphed_model = model  # the loop's last: the graphed run's
    fresh = model_of("topdown", dropout=0.5).cuda()
    fresh.load_state_dict(graphed_model.state_dict())
    ctx_batch = ToyData().batch(list(range(8)))
    with torch.no_grad():
        got, want = (decoding.sample(m.eval(), m.encode(ctx_batch.pooled.cuda(), ctx_batch.regions.cuda()), 6,
                                     greedy=True).logprobs for m in (graphed_model, fresh))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for x, y in zip(runs["eager"][0], runs["graphed"][0]):
        torch.testing.assert_close(torch.tensor(y["step_losses"]), torch.tensor(x["step_losses"]), atol=1e-6, rtol=1e-6)
    for key, value in runs["eager"][1].items():
        if not key.endswith("attention.score.bias"):  # its gradient is rounding noise (see above)
            torch.testing.assert_close(runs["graphed"][1][key], value, atol=1e-5, rtol=1e-5, msg=key)
    # stopped by SIGTERM after its 4th step (replays under way), resumed in a fresh trainer: bit-identical
    model = model_of("topdown", dropout=0.5).cuda()
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)
    first = _graphed_trainer(model, tmp_path / "resumed", dist=dist, capture=True)
    first.graphed.warmup = 1
    with sigterm_after_step(4), pytest.raises(Preempted):
        fit(first)
    model = model_of("topdown", dropout=0.5, seed=9).cuda()
    again = _graphed_trainer(model, tmp_path / "resumed", dist=dist, capture=True)
    again.graphed.warmup = 1
    assert again.resume()
    fit(again)
    assert again.graphed.graph is not None
    for key, value in runs["graphed"][1].items():
        assert torch.equal(model.state_dict()[key], value), f"{key} differs after a resume"


def test_plain_autograd_inside_the_step() -> None:
    """The captured body runs the layers as plain autograd (tapes keep host state between steps)."""
    seen = []
    model = model_of("fc")
    real = model.core

    def core(*args: Any) -> Any:
        seen.append(timeshared.enabled())
        return real(*args)

    model.core = core
    objective = xe(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = graphs.GraphedStep(lambda b: objective.fixed_loss(model, b), objective.fixed_step, optimizer,
                              [list(model.parameters())], 2.0, capture=False)
    loss, _ = step.run(ToyData().batch([0, 1, 2]))
    assert seen and not any(seen) and bool(torch.isfinite(loss))


def test_a_decode_off_cuda_or_with_gradients_runs_as_it_is() -> None:
    from caprl.decoding import captured

    model = model_of("fc")
    calls = []
    with torch.no_grad():
        out = captured.run(model, ("x",), lambda c: calls.append(c) or c["img"] * 2, {"img": torch.ones(2)})
    assert torch.equal(out, torch.full((2,), 2.0)) and len(calls) == 1 and model not in captured._graphs


DECODES = {"greedy": lambda m, ctx: decoding.greedy_decoder(m, ctx, 6),
           "beam": lambda m, ctx: decoding.top_k_beams_decoder(m, ctx, 6, beam_size=3, n=3)}


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available(), reason="needs CUDA (a capture)")
@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
@pytest.mark.parametrize("decode", sorted(DECODES))
def test_on_cuda_a_replayed_decode_is_the_eager_one(arch: str, decode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.decoding import captured

    monkeypatch.setattr(timeshared, "MIN_TAPED", 0)  # the tapes' cached joined weights are made inside the graph
    model = model_of(arch, dropout=0.5).cuda().eval()
    data = ToyData()

    def both(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        pooled, regions = (t.cuda() for t in data.features_of(ids))
        with torch.no_grad():
            ctx = model.encode(pooled, regions)
            got = DECODES[decode](model, ctx)
            captured.set_enabled(False)
            try:
                want = DECODES[decode](model, ctx)
            finally:
                captured.set_enabled(True)
        return got, want

    for ids in (list(range(8)), list(range(8, 16)), list(range(5)), list(range(8, 16))):  # captures, replays, 2 shapes
        got, want = both(ids)
        assert torch.equal(got, want), ids
    graphs = captured._graphs[model]
    assert len(graphs) == 2 and all(g is not captured._FAILED for g in graphs.values())
    with torch.no_grad():  # weights changed in place (as an optimiser step does): the replay reads them
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    got, want = both(list(range(8)))
    assert torch.equal(got, want)
    assert len(captured._graphs[model]) == 2  # the same storage: replayed, not captured again


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available(), reason="needs CUDA (a capture)")
def test_on_cuda_a_capture_whose_replay_differs_stays_eager(caplog: pytest.LogCaptureFixture) -> None:
    from caprl.decoding import captured

    model = model_of("fc").cuda()
    img = torch.ones(4, device="cuda")
    with torch.no_grad():  # a fresh draw at every call: the first replay cannot equal the warm-up
        outs = [captured.run(model, ("noisy",), lambda c: c["img"] + torch.rand_like(c["img"]), {"img": img})
                for _ in range(2)]
    assert next(iter(captured._graphs[model].values())) is captured._FAILED
    assert not torch.equal(outs[0], outs[1]) and "differs" in caplog.text
