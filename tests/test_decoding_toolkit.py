"""The decoding toolkit: start + rollout = sample, per-step entropy and hidden state, relaxed
(straight-through) samples, and the named decoders."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from caprl import decoding
from caprl.decoding import DECODERS, ESTIMATORS
from caprl.models import build_model
from numerics import assert_float64_close, to_float64
from toy import ending_model

V = 7


def model_and_ctx(arch: str = "topdown", n_images: int = 3, double: bool = False):
    """``double``: the same model and images in float64 (tests/numerics.py)."""
    torch.manual_seed(0)
    sizes = {"embed_size": 8, "hidden_size": 12, "dropout": 0.0}
    if arch != "fc":
        sizes["att_hidden_size"] = 6
    model = build_model(arch, sizes, V, 5, 4).eval()
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(n_images, 5, generator=gen), torch.randn(n_images, 4, 5, generator=gen)
    if double:
        model, *images = to_float64(model, *images)
    ctx = model.encode(*images)
    return model, ctx


@pytest.mark.numerics
def test_sample_is_start_then_rollout_and_a_rollout_continues_any_state() -> None:
    model, ctx = model_and_ctx()
    with torch.no_grad():
        whole = decoding.sample(model, ctx, 6, greedy=True)
        first = decoding.rollout(model, decoding.start(model, ctx), 2, greedy=True, keep_states=True)
        rest = decoding.rollout(model, first.after[-1], 4, greedy=True)
    assert torch.equal(torch.cat([first.tokens[..., :2], rest.tokens[..., :4]], -1), whole.tokens)
    assert first.after[-1].t == 2


@pytest.mark.numerics
def test_entropy_and_hidden_are_those_of_each_step() -> None:
    model, ctx = model_and_ctx("fc")
    with torch.no_grad():
        out = decoding.sample(model, ctx, 5, n=2, keep_entropy=True, keep_hidden=True)
        at = decoding.start(model, ctx, 2)
        step = model.step(at.prev, at.ctx, at.state)
    p = step.logprobs.exp()
    # bit-identical: the decode's first step is this step (same rows, same kernels), its entropy this formula
    assert torch.equal(out.entropy[:, :, 0], -(p * step.logprobs).sum(-1))
    assert torch.equal(out.hidden[:, :, 0], step.hidden)
    assert out.hidden.shape == (6, 1, 5, 12)
    assert bool(((out.entropy > 0) == (out.mask > 0)).all())  # 0 after a caption's end


@pytest.mark.parametrize("name", ["st_gumbel", "st_multinomial"])
def test_straight_through_rows_are_one_hot_forward_with_gradients_backward(name: str) -> None:
    model, ctx = model_and_ctx()
    torch.manual_seed(2)
    out = decoding.sample(model.train(), ctx, 4, estimator=ESTIMATORS[name](tau=1.0))
    soft = out.soft  # [N, S, T, V]
    assert soft is not None and soft.shape == (3, 1, 4, V)
    live = out.mask.bool()
    torch.testing.assert_close(soft[live].sum(-1), torch.ones(int(live.sum())))
    assert torch.equal(soft[live].argmax(-1), out.tokens[live])
    assert bool(((soft[live] == 0) | (soft[live] == 1)).all())  # exactly one-hot forward
    (soft * torch.arange(V, dtype=soft.dtype)).sum().backward()
    assert model.logit.weight.grad is not None and model.logit.weight.grad.abs().sum() > 0


@pytest.mark.numerics
def test_psst_relaxed_captions_pass_the_whole_distribution_the_others_one_hot() -> None:
    # the estimator's relaxed distribution against exp of the step's log-softmax: other kernels, in float64
    model, ctx = model_and_ctx(double=True)
    torch.manual_seed(3)
    relaxed = torch.tensor([True, False, True])
    out = decoding.sample(model, ctx, 3, estimator=ESTIMATORS["st_multinomial"](tau=1.0), relaxed=relaxed)
    assert out.soft is not None
    first = out.soft[:, :, 0]
    at = decoding.start(model, ctx)
    probs = model.step(at.prev, at.ctx, at.state).logprobs.exp()
    assert_float64_close(first[relaxed], probs[relaxed])
    live = out.mask[1].bool()
    assert bool(((out.soft[1][live] == 0) | (out.soft[1][live] == 1)).all())


def test_partial_mask_is_seeded_and_takes_a_rho_fraction() -> None:
    masks = [decoding.partial_mask(8, 0.25, torch.Generator().manual_seed(5), torch.device("cpu")) for _ in range(2)]
    assert torch.equal(masks[0], masks[1]) and int(masks[0].sum()) == 2
    assert int(decoding.partial_mask(8, 0.0, torch.Generator(), torch.device("cpu")).sum()) == 0
    assert bool(decoding.partial_mask(8, 1.0, torch.Generator(), torch.device("cpu")).all())


@pytest.mark.numerics
def test_named_decoders_shapes_and_agreement() -> None:
    model, ctx = model_and_ctx()
    with torch.no_grad():
        greedy = DECODERS["greedy"](model, ctx, 6)
        beam1 = DECODERS["beam"](model, ctx, 6, beam_size=1)
        top = DECODERS["top_k_beams"](model, ctx, 6, beam_size=4, n=3)
        samples = DECODERS["sample"](model, ctx, 6, n=5)
    assert greedy.shape == beam1.shape == (3, 1, 6) and torch.equal(greedy, beam1)
    assert top.shape == (3, 3, 6) and samples.shape == (3, 5, 6)
    assert torch.equal(top[:, 0], DECODERS["beam"](model, ctx, 6, beam_size=4)[:, 0])
    with pytest.raises(Exception, match="unknown decoder 'nope'"):
        DECODERS.get("nope", where="decode.method")


def test_decode_split_covers_every_image_once_in_batches() -> None:
    model, _ = model_and_ctx()
    gen = torch.Generator().manual_seed(4)
    pooled, regions = torch.randn(7, 5, generator=gen), torch.randn(7, 4, 5, generator=gen)
    lookup = {i: k for k, i in enumerate(range(100, 107))}

    def features_of(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor([lookup[i] for i in ids])
        return pooled[rows], regions[rows]

    seen = []
    for ids, tokens in decoding.decode_split(model, features_of, list(lookup), lambda m, c: DECODERS["greedy"](m, c, 5),
                                             batch_size=3):
        assert tokens.shape[0] == len(ids) <= 3
        seen += ids
    assert seen == list(lookup)


def count_shrinks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for every LiveRows.shrink call, whether it dropped rows."""
    from caprl.decoding import live_rows

    shrinks: list[bool] = []
    real = live_rows.LiveRows.shrink

    def counted(self: Any, *args: Any) -> Any:
        out = real(self, *args)
        shrinks.append(out is not None)
        return out

    monkeypatch.setattr(live_rows.LiveRows, "shrink", counted)
    return shrinks


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_ended_rows_leave_a_cpu_decode_and_nothing_changes(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """caprl.decoding.live_rows: in eval mode on a CPU the decode drops ended rows as it goes; the captions and
    masks equal those of stepping every row, the log-probabilities and entropies up to summation order
    (a product over fewer rows may add in another order: both decodes run in float64, tests/numerics.py)."""
    from caprl.decoding import live_rows

    model, pooled, regions = to_float64(ending_model(arch).eval(), torch.randn(20, 8), torch.randn(20, 4, 8))
    ctx = model.encode(pooled, regions)
    shrinks = count_shrinks(monkeypatch)
    runs = []
    for at in (live_rows.SHRINK_AT, -1.0):  # -1: never shrink (every row stepped to the end)
        monkeypatch.setattr(live_rows, "SHRINK_AT", at)
        noisy = decoding.sample(model, ctx, 10, n=3, noise=decoding.Noise(seed=2, step=1, total=20), keep_entropy=True)
        greedy = decoding.sample(model, ctx, 10, greedy=True)
        runs.append((noisy, greedy))
    assert any(shrinks)
    (a, ga), (b, gb) = runs
    for x, y in ((a, b), (ga, gb)):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.mask, y.mask)
        assert_float64_close(x.logprobs, y.logprobs)
        assert (x.attention is None) == (y.attention is None)
    assert_float64_close(a.entropy, b.entropy)
    assert 0 < float(a.mask.sum(-1).min()) < float(a.mask.sum(-1).max()) < 10  # captions of several lengths


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "lstm3", "softatt", "topdown", "stackcap"])
def test_a_training_decode_drops_ended_rows_with_the_same_samples_masks_and_gradients(
        arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In train mode too the decode drops ended rows, and its dropout masks stay the full batch's
    (caprl.models.base.RowDropout): the same samples, and the same loss and gradients (up to
    summation order: both decodes run in float64, tests/numerics.py), as stepping every row; each
    architecture applies dropout in its own places."""
    from caprl.decoding import live_rows

    model, pooled, regions = to_float64(ending_model(arch).train(), torch.randn(20, 8), torch.randn(20, 4, 8))
    shrinks = count_shrinks(monkeypatch)
    runs = []
    for at in (live_rows.SHRINK_AT, -1.0):  # -1: never shrink (every row stepped to the end)
        monkeypatch.setattr(live_rows, "SHRINK_AT", at)
        torch.manual_seed(7)  # the dropout masks' stream
        model.zero_grad(set_to_none=True)
        ctx = model.encode(pooled, regions)
        samples = decoding.sample(model, ctx, 10, n=3, noise=decoding.Noise(seed=2, step=1, total=20))
        loss = (samples.logprobs * samples.mask * torch.linspace(-1, 1, 60).view(60, 1, 1)).sum()
        loss.backward()
        runs.append((samples, loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, loss_a, grads_a), (b, loss_b, grads_b) = runs
    assert any(shrinks) and torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert 0 < float(a.mask.sum(-1).min()) < float(a.mask.sum(-1).max()) < 10  # captions of several lengths
    assert_float64_close(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert_float64_close(grads_a[name], grads_b[name], msg=name)


@pytest.mark.numerics
def test_row_dropout_is_the_full_batch_dropout_of_the_stepped_rows() -> None:
    """RowDropout inside stepped_rows: the stepped rows of torch's own dropout of the whole batch."""
    from caprl.models.base import RowDropout, stepped_rows

    x = torch.randn(10, 3, 5)
    keep = torch.tensor([1, 4, 9])
    torch.manual_seed(3)
    full = torch.nn.functional.dropout(x, 0.4, training=True)
    torch.manual_seed(3)
    with stepped_rows(10, keep):
        mine = RowDropout(0.4).train()(x[keep])
    assert torch.equal(mine, full[keep])
    with stepped_rows(10, keep), pytest.raises(Exception, match="4 rows inside a decode step of 3"):
        RowDropout(0.4).train()(torch.randn(4, 5))
