"""Relaxed speaker inputs (paper 004, PSST): every architecture reads rows over the vocabulary as
well as token ids, the time-shared tapes stay exact when both meet in one loss, and
``decoding.rollout``'s feed modes (``word``, ``relaxed``, ``straight_through``) pass to the next
step what they say, gradients included."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.decoding import ESTIMATORS
from caprl.errors import CaprlError
from caprl.models import MODELS, build_model, timeshared
from numerics import assert_float64_close, summation_atol, to_float64
from toy import record_step_inputs

V, FEAT, REGIONS = 9, 6, 4
ARCHS = sorted(name for name, _ in MODELS.items())


def make_model(arch: str, dropout: float = 0.0) -> Any:
    sizes: dict[str, Any] = {"embed_size": 8, "hidden_size": 12, "dropout": dropout}
    if "att_hidden_size" in MODELS.get(arch).config_class.__dataclass_fields__:
        sizes["att_hidden_size"] = 7
    if "cell" in MODELS.get(arch).config_class.__dataclass_fields__:
        sizes["cell"] = "lstm"  # the random toy decodes these tests were laid out on (maxout's may end at once)
    if "d_model" in MODELS.get(arch).config_class.__dataclass_fields__:  # the transformer: its own sizes
        sizes = {"num_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16, "dropout": dropout, "feat_dropout": dropout}
    torch.manual_seed(0)
    return build_model(arch, sizes, V, FEAT, REGIONS)


def encode(model: Any, images: int = 3) -> Any:
    """Random images, in the model's dtype (float32, or float64 where a test compares two paths)."""
    gen = torch.Generator().manual_seed(1)
    dtype = next(model.parameters()).dtype
    return model.encode(torch.randn(images, FEAT, generator=gen).to(dtype),
                        torch.randn(images, REGIONS, FEAT, generator=gen).to(dtype))


# --- task 1: every architecture reads rows over the vocabulary -------------------------------------
@pytest.mark.numerics
@pytest.mark.parametrize("taped", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_one_hot_rows_step_exactly_as_their_ids_and_pass_gradients(arch: str, taped: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if taped:
        monkeypatch.setattr(timeshared, "MIN_TAPED", 0)  # the ids go through the tape, the rows never
    model = make_model(arch).train()
    ctx = encode(model)
    state = model.init_state(ctx)
    ids = torch.tensor([[3, 1, 4], [0, 5, 8], [2, 2, 7]])[:, : model.n_stages]
    rows = F.one_hot(ids, V).float().requires_grad_(True)
    by_ids, by_rows = model.step(ids, ctx, state), model.step(rows, ctx, state)
    assert torch.equal(by_rows.logprobs, by_ids.logprobs) and torch.equal(by_rows.hidden, by_ids.hidden)
    assert all(torch.equal(a, b) for a, b in zip(by_rows.state, by_ids.state))
    weights = torch.randn(by_rows.logprobs.shape, generator=torch.Generator().manual_seed(2))
    ((by_rows.logprobs + by_ids.logprobs) * weights).sum().backward()
    timeshared.check(model)
    assert rows.grad is not None and rows.grad.abs().sum() > 0
    assert model.embed.weight.grad is not None


def test_rows_of_another_vocabulary_are_an_error() -> None:
    model = make_model("fc")
    with pytest.raises(CaprlError, match="rows of 4 entries, vocabulary of 9"):
        timeshared.embedding(model.embed, torch.zeros(2, 4))


def _grads(model: Any, loss_fn: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    timeshared.reset(model)
    torch.manual_seed(3)  # the same samples and dropout on both paths
    loss_fn().backward()
    timeshared.check(model)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_tapes_stay_exact_when_rows_and_ids_meet_in_one_loss(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeshared, "MIN_TAPED", 0)
    model = to_float64(make_model(arch, dropout=0.3).train())  # taped against plain autograd: other sums

    def loss() -> torch.Tensor:  # start-token ids, then relaxed rows; and a decode of ids alone
        ctx = encode(model)
        relaxed = decoding.sample(model, ctx, 5, n=2, estimator=ESTIMATORS["st_multinomial"](1.0),
                                  relaxed=torch.tensor([True, False] * 3), feed="relaxed")
        plain = decoding.sample(model, ctx, 5, n=2)
        assert relaxed.soft is not None
        weights = torch.linspace(-1, 1, V)
        return (relaxed.soft * weights).sum() - (plain.logprobs * plain.mask).sum()

    taped = _grads(model, loss)
    with timeshared.disabled():
        plain = _grads(model, loss)
    assert taped.keys() == plain.keys() and "embed.weight" in taped
    for name in plain:
        assert_float64_close(taped[name], plain[name], msg=name)
    # a dropped mixed decode leaves its taped (id) uses pending: an error until reset
    decoding.sample(model, encode(model), 5, estimator=ESTIMATORS["st_gumbel"](1.0), feed="straight_through")
    with pytest.raises(CaprlError, match="under torch.no_grad"):
        timeshared.check(model)
    timeshared.reset(model)
    timeshared.check(model)


# --- task 2: rollout's feed modes --------------------------------------------------------------------
RELAXED = torch.tensor([True, False, True])


def decode_with(feed: str, relaxed: torch.Tensor | None = RELAXED, estimator: str = "st_multinomial",
                seed: int = 4, arch: str = "topdown") -> tuple[decoding.Samples, list[torch.Tensor], Any]:
    model = make_model(arch).train()
    seen = record_step_inputs(model)
    torch.manual_seed(seed)
    out = decoding.sample(model, encode(model), 5, estimator=ESTIMATORS[estimator](1.0), relaxed=relaxed, feed=feed)
    return out, seen, model


@pytest.mark.parametrize("arch", ["fc", "stackcap"])
@pytest.mark.parametrize("feed", ["word", "relaxed", "straight_through"])
def test_each_feed_mode_reads_what_it_says(feed: str, arch: str) -> None:
    out, seen, _ = decode_with(feed, arch=arch)
    assert out.soft is not None
    for i in range(1, len(seen)):
        words, passed, live = out.tokens[:, :, i - 1], out.soft[:, :, i - 1], ~(out.tokens[:, :, i - 1] == 0)
        if feed == "word":
            assert seen[i].dtype == torch.long and torch.equal(seen[i], words)
            continue
        fed, hard = seen[i].detach(), F.one_hot(words, V).float()
        wanted = passed.detach() if feed == "straight_through" else torch.where(RELAXED.view(-1, 1, 1), passed.detach(), hard)
        torch.testing.assert_close(fed[live], wanted[live], rtol=0, atol=summation_atol(3, 1.0))  # ST's h - p + p
        assert torch.equal(fed[~live], hard[~live])  # an ended row reads the end token, as with ids
    if feed == "relaxed":  # a relaxed caption's word is its distribution's argmax; the others are sampled
        live = out.mask.bool()
        assert torch.equal(out.tokens[RELAXED][live[RELAXED]], out.soft[RELAXED].argmax(-1)[live[RELAXED]])


@pytest.mark.parametrize("feed", ["word", "relaxed", "straight_through"])
def test_gradients_flow_through_the_fed_forward_rows_only_where_the_feed_passes_them(feed: str) -> None:
    """A loss on the rows of steps >= 1 only: its gradient reaches step 0's distribution only
    through what step 0 fed forward (relaxed: the relaxed rows; straight_through: every row)."""
    model = make_model("fc").train()
    first: list[torch.Tensor] = []
    real = model.step

    def step(words: torch.Tensor, ctx: Any, state: Any) -> Any:
        out = real(words, ctx, state)
        if not first:
            out.logprobs.retain_grad()
            first.append(out.logprobs)
        return out

    model.step = step
    torch.manual_seed(4)
    out = decoding.sample(model, encode(model), 5, estimator=ESTIMATORS["st_multinomial"](1.0), relaxed=RELAXED,
                          feed=feed)
    assert out.soft is not None
    (out.soft[:, :, 1:] * torch.linspace(-1, 1, V)).sum().backward()
    grad = first[0].grad
    reached = torch.zeros(3, dtype=torch.bool) if grad is None else grad.abs().sum(dim=(1, 2)) > 0
    expected = {"word": torch.zeros(3, dtype=torch.bool), "relaxed": RELAXED, "straight_through": torch.ones(3, dtype=torch.bool)}
    assert torch.equal(reached, expected[feed])


def test_relaxed_multinomial_captions_are_a_deterministic_function_of_the_image() -> None:
    everything = torch.ones(3, dtype=torch.bool)
    (a, _, _), (b, _, _) = (decode_with("relaxed", everything, seed=s) for s in (1, 2))
    assert a.soft is not None and b.soft is not None
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.soft, b.soft)
    (c, _, _), (d, _, _) = (decode_with("straight_through", everything, seed=s) for s in (1, 2))
    assert not torch.equal(c.tokens, d.tokens)  # the code's relaxed rows still follow the sampled word's end


def test_a_per_token_mask_relaxes_each_step_on_its_own() -> None:
    mask = decoding.partial_token_mask(3, 5, 0.5, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert mask.shape == (3, 5) and mask.dtype == torch.bool and 0 < int(mask.sum()) < 15
    assert torch.equal(mask, decoding.partial_token_mask(3, 5, 0.5, torch.Generator().manual_seed(0), torch.device("cpu")))
    out, _, _ = decode_with("straight_through", mask, estimator="st_gumbel")
    assert out.soft is not None
    hard = F.one_hot(out.soft.argmax(-1), V).float()
    one_hot = (out.soft.detach() - hard).abs().amax(-1) < 1e-6  # [N, S, T]
    live = out.mask.bool()
    steps = live.shape[-1]
    assert torch.equal(one_hot[live], (~mask[:, None, :steps].expand_as(live))[live])


@pytest.mark.parametrize("kwargs, message", [
    ({"feed": "relaxed"}, "feed 'relaxed' needs an estimator"),
    ({"feed": "soft", "estimator": ESTIMATORS["st_gumbel"](1.0)}, "unknown feed mode 'soft'"),
    ({"feed": "relaxed", "estimator": ESTIMATORS["st_gumbel"](1.0)}, "needs the relaxed rows"),
    ({"estimator": ESTIMATORS["st_gumbel"](1.0), "relaxed": torch.ones(3, 2, dtype=torch.bool)}, r"\[3, >= 4\]"),
    ({"estimator": ESTIMATORS["st_gumbel"](1.0), "relaxed": torch.ones(2, dtype=torch.bool)}, r"bool \[3\]"),
])
def test_inconsistent_feed_options_are_errors(kwargs: dict[str, Any], message: str) -> None:
    model = make_model("fc")
    with pytest.raises(CaprlError, match=message):
        decoding.sample(model, encode(model), 4, **kwargs)
