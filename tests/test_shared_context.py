"""Per-image context on a CPU (caprl.models.base.Shared): an image's regions stored once and read
by its rows through a row map, the attended feature one product per image. Every decode and loss
must equal the per-row copies a GPU decodes with (SHARE_ON_CPU off): the same captions, losses and
gradients up to summation order (one product per image against one per row: compared in float64,
tests/numerics.py), through live-row shrinking, XE's length sort and beam search."""

from __future__ import annotations

import pytest
import torch

from caprl import decoding
from caprl.decoding import live_rows
from caprl.models import base
from caprl.models import timeshared as ts
from caprl.models.attention import attend
from caprl.models.base import Shared, map_batch, map_tensors
from numerics import assert_float64_close, to_float64
from toy import ending_model

ATTENTION = ["softatt", "topdown", "stackcap", "stackcap_star"]


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert_float64_close(a[name], b[name], msg=name)


def test_layout_places_every_row_of_an_image_in_its_own_slot() -> None:
    data = torch.zeros(3, 2)
    in_order = Shared(data, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert in_order.layout() == (2, None)
    rows = torch.tensor([2, 0, 2, 1, 2, 0])  # any order, unequal counts
    m, pos = Shared(data, rows).layout()
    assert m == 3 and pos is not None
    assert torch.equal(pos // m, rows) and len(set(pos.tolist())) == len(rows)
    assert Shared(data).shape == (3, 2) and Shared(data, rows).shape == (6, 2)


def test_row_operations_move_the_row_map_and_copies_take_the_data() -> None:
    data = torch.randn(2, 3, 4)
    ctx = {"feats": Shared(data), "mean": torch.randn(2, 4)}
    expanded = decoding.expand(ctx, 3)
    assert expanded["feats"].data is data and expanded["feats"].rows.tolist() == [0, 0, 0, 1, 1, 1]
    picked = map_batch(lambda t: t.index_select(0, torch.tensor([5, 1])), expanded)
    assert picked["feats"].rows.tolist() == [1, 0] and picked["mean"].shape == (2, 4)
    cloned = map_tensors(torch.clone, expanded)  # what a CUDA graph's static inputs are made with
    assert cloned["feats"].data.data_ptr() != data.data_ptr() and torch.equal(cloned["feats"].data, data)
    assert decoding._first(expanded).shape[0] == 6  # a decode counts rows, not images


@pytest.mark.numerics
@pytest.mark.parametrize("rows", [[0, 0, 1, 1], [1, 0, 1, 1, 0]])
def test_attend_equals_a_product_per_row(rows: list[int]) -> None:
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    alpha = torch.softmax(torch.randn(len(rows), 5, generator=gen, dtype=torch.float64), -1).requires_grad_()
    index = torch.tensor(rows)
    per_row = torch.bmm(alpha.unsqueeze(1), data.index_select(0, index)).squeeze(1)
    assert_float64_close(attend(alpha, Shared(data, index)), per_row)
    assert torch.autograd.gradcheck(lambda a, d: attend(a, Shared(d, index)), (alpha, data))


@pytest.fixture(params=["plain", "taped"])
def taped(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The attention scores as plain autograd (small layers), or through the memory-lean tape."""
    if request.param == "taped":
        monkeypatch.setattr(ts, "MIN_TAPED", 0)
    return request.param


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ATTENTION)
def test_a_training_decode_equals_per_row_copies(arch: str, taped: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SCST's decode: 3 samples per image with gradients, ended rows dropped as they end (the rows
    then read their images out of order), a greedy decode beside it."""
    model, pooled, regions = to_float64(ending_model(arch).train(), torch.randn(20, 8), torch.randn(20, 4, 8))
    runs = []
    for share in (True, False):
        monkeypatch.setattr(base, "SHARE_ON_CPU", share)
        torch.manual_seed(7)  # the dropout masks' stream
        model.zero_grad(set_to_none=True)
        ts.reset(model)
        ctx = model.encode(pooled, regions)
        assert isinstance(ctx["mean"], torch.Tensor)
        samples = decoding.sample(model, ctx, 10, n=3, noise=decoding.Noise(seed=2, step=1, total=20))
        with torch.no_grad():
            greedy = decoding.sample(model, ctx, 10, greedy=True)
        loss = (samples.logprobs * samples.mask * torch.linspace(-1, 1, 60).view(60, 1, 1)).sum()
        loss.backward()
        ts.check(model)
        runs.append((samples, greedy, loss, grads(model)))
    (a, ga, loss_a, grads_a), (b, gb, loss_b, grads_b) = runs
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask) and torch.equal(ga.tokens, gb.tokens)
    assert 0 < float(a.mask.sum(-1).min()) < float(a.mask.sum(-1).max()) < 10  # rows ended: shrinks happened
    assert_float64_close(a.attention, b.attention)
    assert_float64_close(loss_a, loss_b)
    assert_same_grads(grads_a, grads_b)


@pytest.mark.numerics
@pytest.mark.parametrize("images", [[0, 0, 1, 2, 2, 2, 3, 3], [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3]],
                         ids=["sparse", "dense"])  # dense: most of the grid's slots are rows (computed whole)
@pytest.mark.parametrize("arch", ATTENTION)
def test_xe_over_unequal_captions_per_image_equals_per_row_copies(arch: str, images: list[int], taped: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """XE reads each image's captions (1 to 3 of them) sorted by length, and drops rows as
    captions end: the log-probabilities and gradients of per-row copies."""
    model = ending_model(arch).train()
    gen = torch.Generator().manual_seed(3)
    model, pooled, regions = to_float64(model, torch.randn(4, 8, generator=gen), torch.randn(4, 4, 8, generator=gen))
    label_image = torch.tensor(images)
    labels = torch.randint(1, 12, (len(images), 7), generator=gen)
    for row, length in enumerate([7, 3, 5, 1, 7, 2, 4, 6, 3, 5, 2][: len(images)]):
        labels[row, length:] = 0
    runs = []
    for share in (True, False):
        monkeypatch.setattr(base, "SHARE_ON_CPU", share)
        torch.manual_seed(5)
        model.zero_grad(set_to_none=True)
        ts.reset(model)
        ctx = map_batch(lambda t: t.index_select(0, label_image), model.encode(pooled, regions))
        logprobs = model.token_logprobs(ctx, labels)
        (-logprobs.sum()).backward()
        ts.check(model)
        runs.append((logprobs.detach(), grads(model)))
    assert_float64_close(runs[0][0], runs[1][0])
    assert_same_grads(runs[0][1], runs[1][1])


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ATTENTION)
def test_beam_search_equals_per_row_copies(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, pooled, regions = to_float64(ending_model(arch).eval(), torch.randn(6, 8), torch.randn(6, 4, 8))
    runs = []
    for share in (True, False):
        monkeypatch.setattr(base, "SHARE_ON_CPU", share)
        with torch.no_grad():
            runs.append(decoding.beam_search(model, model.encode(pooled, regions), 3, 10))
    assert torch.equal(runs[0][0], runs[1][0])
    assert_float64_close(runs[0][1], runs[1][1])


def test_a_gpu_context_is_per_row_copies() -> None:
    """Off a CPU the context stays plain tensors (a row map's layout would need a host read)."""
    data = torch.zeros(2, 3, device="meta")
    assert base.shared(data) is data
    assert isinstance(base.shared(torch.zeros(2, 3)), Shared)


@pytest.mark.numerics
def test_pg_spider_rollouts_equal_per_row_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Monte-Carlo roll-outs continue every prefix k times: the row map is repeated with them."""
    model = ending_model("topdown").eval()
    pooled, regions = torch.randn(4, 8), torch.randn(4, 4, 8)
    runs = []
    for share in (True, False):
        monkeypatch.setattr(base, "SHARE_ON_CPU", share)
        with torch.no_grad():
            ctx = model.encode(pooled, regions)
            samples = decoding.sample(model, ctx, 6, n=2, noise=decoding.Noise(seed=1, step=0, total=4),
                                      keep_states=True)
            runs.append(decoding.rollouts_from_prefixes(model, samples, 2, 6,
                                                        noise=decoding.Noise(seed=3, step=0, total=8)))
    assert torch.equal(runs[0], runs[1])
    assert live_rows.SHRINK_AT > 0
