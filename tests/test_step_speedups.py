"""The training step's shortcuts change no number: each is checked against the plain computation.

* XE encodes each image once and expands its context per gold caption: the loss equals the
  one of encoding every caption's image separately.
* Teacher forcing skips the padding and runs the output layer once (``token_logprobs``):
  equal to gathering the step-by-step ``teacher_forcing``.
* Time-shared layers (``caprl.models.timeshared``) compute each weight's gradient once per
  backward: equal to plain autograd's, for XE and for sampling, every architecture; their
  LSTM step equals torch's ``nn.LSTMCell``; a use whose output never reaches the loss is an
  error, not a silent zero gradient.
* SCST with fixed noise samples the same captions whatever the path (gradients on, off, or
  plain autograd).

The paths differ in their matmul shapes and summation orders: the numbers are compared in float64
(tests/numerics.py).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

from caprl import decoding
from caprl.data.batch import Batch
from caprl.errors import CaprlError
from caprl.models import MODELS, build_model, timeshared
from caprl.objectives import ObjectiveEnv, build_objective
from numerics import assert_float64_close, to_float64
from toy import CONSTANT_LR
from caprl.objectives.xe import gold_targets, token_mask

ARCHS = sorted(name for name, _ in MODELS.items())


@pytest.fixture(autouse=True)
def tape_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """These models are tiny: tape them anyway (by default only layers of >= MIN_TAPED elements are)."""
    monkeypatch.setattr(timeshared, "MIN_TAPED", 0)
VOCAB, FEAT, REGIONS = 30, 8, 4


def make_model(arch: str, dropout: float = 0.3) -> Any:
    cls = MODELS.get(arch, where="test")
    fields = set(cls.config_class.__dataclass_fields__)
    if "d_model" in fields:  # the Transformer: its own sizes
        sizes = {"d_model": 16, "heads": 2, "num_layers": 1, "d_ff": 24, "dropout": dropout}
    else:
        sizes = {"embed_size": 16, "hidden_size": 12, "dropout": dropout}
    if "att_hidden_size" in fields:
        sizes["att_hidden_size"] = 10
    torch.manual_seed(0)
    return build_model(arch, sizes, VOCAB, FEAT, REGIONS)


def make_batch(images: int = 4, per_image: int = 3, length: int = 7) -> Batch:
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(1, VOCAB, (images * per_image, length), generator=gen)
    ends = torch.randint(0, length + 1, (images * per_image,), generator=gen)
    ends[0] = length  # one caption of full length, one empty
    ends[1] = 0
    labels[torch.arange(length)[None, :] >= ends[:, None]] = 0
    return Batch(image_ids=list(range(images)), pooled=torch.randn(images, FEAT, generator=gen),
                 regions=torch.randn(images, REGIONS, FEAT, generator=gen), labels=labels,
                 label_image=torch.arange(images).repeat_interleave(per_image))


def env() -> ObjectiveEnv:
    return ObjectiveEnv(decode_words=lambda t: [[str(int(w)) for w in row if w] for row in t],
                        reward=lambda name: None, max_length=8)  # type: ignore[arg-type,return-value]


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ARCHS)
def test_xe_loss_equals_encoding_every_caption_separately(arch: str) -> None:
    model, batch = to_float64(make_model(arch).eval(), make_batch())
    xe = build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR}, env(), model)
    loss, _ = xe.loss(model, batch)
    # the plain computation: each caption's image encoded on its own, every step's full distribution
    ctx = model.encode(batch.pooled[batch.label_image], batch.regions[batch.label_image])
    logprobs = model.teacher_forcing(ctx, batch.labels)  # [M, S, T+1, V]
    targets, mask = gold_targets(batch.labels), token_mask(batch.labels)
    picked = logprobs.gather(-1, targets[:, None, :, None].expand(-1, logprobs.shape[1], -1, 1)).squeeze(-1)
    reference = sum(-(picked[:, s] * mask).sum() / mask.sum() for s in range(picked.shape[1]))
    assert_float64_close(loss, reference)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ARCHS)
def test_token_logprobs_are_the_gathered_teacher_forcing(arch: str) -> None:
    model, batch = to_float64(make_model(arch).eval(), make_batch())
    ctx = model.encode(batch.pooled[batch.label_image], batch.regions[batch.label_image])
    full = model.teacher_forcing(ctx, batch.labels)
    picked = full.gather(-1, gold_targets(batch.labels)[:, None, :, None].expand(-1, full.shape[1], -1, 1))
    mask = token_mask(batch.labels)[:, None, :]
    fast = model.token_logprobs(ctx, batch.labels)
    assert fast.shape == picked.shape[:-1]
    assert_float64_close(fast, picked.squeeze(-1) * mask)
    assert bool((fast[mask.expand_as(fast) == 0] == 0).all())


def _grads(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    timeshared.reset(model)
    torch.manual_seed(3)  # the same dropout masks on both paths
    loss = loss_fn()
    loss.backward()
    timeshared.check(model)
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["xe", "sample"])
def test_taped_gradients_equal_plain_autograd(arch: str, kind: str) -> None:
    model, batch = to_float64(make_model(arch).train(), make_batch())

    def loss() -> torch.Tensor:
        if kind == "xe":
            ctx = model.encode(batch.pooled[batch.label_image], batch.regions[batch.label_image])
            return -model.token_logprobs(ctx, batch.labels).sum()
        samples = decoding.sample(model, model.encode(batch.pooled, batch.regions), 8, n=3,
                                  noise=decoding.Noise(0, 0, total=len(batch.image_ids)))
        return -(samples.logprobs * samples.mask * torch.linspace(-1, 1, samples.mask.shape[0])[:, None, None]).sum()

    taped_loss, taped = _grads(model, loss)
    with timeshared.disabled():
        plain_loss, plain = _grads(model, loss)
    assert_float64_close(taped_loss, plain_loss)
    assert taped.keys() == plain.keys() == {n for n, _ in model.named_parameters()}
    for name in plain:
        assert_float64_close(taped[name], plain[name], msg=name)


@pytest.mark.parametrize("rows", [None, [0, 0, 1, 1], [1, 0, 1]], ids=["per-row", "images-in-order", "any-rows"])
def test_memory_lean_attention_scores_have_exact_gradients(rows: list[int] | None) -> None:
    """Keys per row, or per image (:class:`Shared`) read by rows in order or in any order."""
    from caprl.models.attention import _AdditiveScores
    from caprl.models.base import Shared

    gen = torch.Generator().manual_seed(0)
    n = 3 if rows is None else len(rows)
    data = torch.randn(3 if rows is None else 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    keys = None if rows is None else Shared(data, torch.tensor(rows))
    args = [data,
            torch.randn(n, 4, generator=gen, dtype=torch.float64, requires_grad=True),
            torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True),
            torch.randn(1, generator=gen, dtype=torch.float64, requires_grad=True), None, keys]
    assert torch.autograd.gradcheck(_AdditiveScores.apply, args)


@pytest.mark.numerics
@pytest.mark.parametrize("grad", [True, False])
def test_lstm_step_equals_torch_lstm_cell(grad: bool) -> None:
    torch.manual_seed(0)
    cell, x, h, c = to_float64(nn.LSTMCell(12, 8), torch.randn(5, 12), torch.randn(5, 8), torch.randn(5, 8))
    reference = cell(x, (h, c))
    with torch.set_grad_enabled(grad):
        plain = timeshared.lstm_cell(cell, x, (h, c))
        timeshared.reset(cell)  # a tape records one layout at a time
        # the input split: columns 4:8 projected apart (as Top-Down does with the mean feature)
        gates = torch.nn.functional.linear(x[:, 4:8], cell.weight_ih[:, 4:8])
        split = timeshared.lstm_cell(cell, torch.cat([x[:, :4], x[:, 8:]], dim=1), (h, c), gates=gates,
                                     columns=(slice(0, 4), slice(8, None)))
    for got in (plain, split):
        for a, b in zip(got, reference):
            assert_float64_close(a, b)


@pytest.mark.numerics
def test_joined_weight_follows_optimiser_updates() -> None:
    torch.manual_seed(0)
    cell, x = to_float64(nn.LSTMCell(6, 4), torch.randn(3, 6))
    state = (torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64))
    with torch.no_grad():
        before = timeshared.lstm_cell(cell, x, state)[0]
    optimiser = torch.optim.Adam(cell.parameters(), lr=0.1, fused=True)
    timeshared.lstm_cell(cell, x, state)[0].sum().backward()
    optimiser.step()
    with torch.no_grad():
        after = timeshared.lstm_cell(cell, x, state)[0]
        assert_float64_close(after, cell(x, state)[0])
    assert not torch.allclose(before, after)


def test_only_large_layers_are_taped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeshared, "MIN_TAPED", 1 << 18)
    small, large = nn.Linear(64, 64), nn.Linear(1024, 512)
    assert not timeshared.taped(*small.parameters()) and timeshared.taped(*large.parameters())
    with torch.no_grad():
        assert not timeshared.taped(*large.parameters())
    large.weight.requires_grad_(False)
    assert not timeshared.taped(*large.parameters())


def test_a_use_that_never_reaches_the_loss_is_an_error() -> None:
    model = make_model("fc").train()
    batch = make_batch()
    ctx = model.encode(batch.pooled, batch.regions)
    state = model.init_state(ctx)
    words = torch.zeros(len(batch.image_ids), 1, dtype=torch.long)
    first = model.step(words, ctx, state)
    model.step(words, ctx, state)  # a second step from the same state whose output is thrown away
    first.logprobs.sum().backward()
    with pytest.raises(CaprlError, match="under torch.no_grad"):
        timeshared.check(model)
    timeshared.reset(model)
    timeshared.check(model)  # reset forgets the dropped graph


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_fixed_noise_samples_the_same_captions_on_every_path(arch: str) -> None:
    model, batch = make_model(arch).train(), make_batch()

    def tokens() -> torch.Tensor:
        torch.manual_seed(5)
        ctx = model.encode(batch.pooled, batch.regions)
        return decoding.sample(model, ctx, 8, n=5, noise=decoding.Noise(7, 2, total=len(batch.image_ids))).tokens

    taped = tokens()
    with torch.no_grad():
        no_grad = tokens()
    with timeshared.disabled():
        plain = tokens()
    assert torch.equal(taped, no_grad) and torch.equal(taped, plain)
