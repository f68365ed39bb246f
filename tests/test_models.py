"""Models and decoding: shapes, beam search vs greedy, teacher forcing consistency."""

from __future__ import annotations

import pytest
import torch

from caprl import decoding
from caprl.models import MODELS, build_model
from numerics import FLOAT64_TOL, assert_float64_close, to_float64

SMALL = {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}
EXTRA = {"topdown": {"att_hidden_size": 8}, "softatt": {"att_hidden_size": 8},
         "stackcap_star": {"att_hidden_size": 8, "n_fine": 2}, "stackcap": {"att_hidden_size": 8, "n_fine": 2},
         "transformer": {"num_layers": 2, "d_model": 16, "heads": 2, "d_ff": 32, "feat_dropout": 0.0,
                         "max_positions": 17}}


def make(arch: str, vocab: int = 11):
    torch.manual_seed(0)
    fields = MODELS.get(arch).config_class.__dataclass_fields__  # the sizes the architecture takes
    options = {k: v for k, v in {**SMALL, **EXTRA.get(arch, {})}.items() if k in fields}
    model = build_model(arch, options, vocab_size=vocab, feat_dim=6, n_regions=4)
    return model.eval()


def inputs(batch: int = 3):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(batch, 6, generator=gen), torch.randn(batch, 4, 6, generator=gen)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_beam_width_one_equals_greedy(arch: str) -> None:
    model = make(arch)
    if model.n_stages > 1:  # beam feeds every stage the beam's word; greedy lets each stage read its own
        pytest.skip("covered by test_stackcap.py::test_beam_width_one_is_the_last_stage_greedy_with_tied_words")
    ctx = model.encode(*inputs())
    greedy = decoding.sample(model, ctx, 16, greedy=True)
    beam, _ = decoding.beam_search(model, ctx, 1, 16)
    assert torch.equal(beam[:, 0], greedy.last_stage())


@pytest.mark.numerics
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_beam_scores_are_sequence_logprobs_and_sorted(arch: str) -> None:
    model, *images = to_float64(make(arch), *inputs())  # beam steps against teacher forcing: other kernels
    ctx = model.encode(*images)
    tokens, scores = decoding.beam_search(model, ctx, 4, 16)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    # re-score the best beam by teacher forcing: the same log-probability
    best = tokens[:, 0]
    logprobs = model.teacher_forcing(ctx, best)[:, -1]  # [B, T+1, V]
    lengths = (best > 0).sum(1)
    for b in range(best.shape[0]):
        n = int(lengths[b])
        targets = torch.cat([best[b, :n], best.new_zeros(1)]) if n < best.shape[1] else best[b]
        total = logprobs[b, torch.arange(len(targets)), targets].sum()
        assert_float64_close(total, scores[b, 0])


@pytest.mark.numerics
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_wider_beam_never_scores_lower(arch: str) -> None:
    model, *images = to_float64(make(arch), *inputs(5))  # 1 and 5 beams step other batch shapes
    ctx = model.encode(*images)
    _, s1 = decoding.beam_search(model, ctx, 1, 16)
    _, s5 = decoding.beam_search(model, ctx, 5, 16)
    assert (s5[:, 0] >= s1[:, 0] - FLOAT64_TOL).all()


def test_samples_stop_at_end_token_and_mask_matches() -> None:
    model = make("fc", vocab=4)  # tiny vocabulary: the end token comes early
    ctx = model.encode(*inputs(8))
    torch.manual_seed(3)
    s = decoding.sample(model, ctx, 16, n=3)
    assert s.tokens.shape == (24, 1, 16)
    for row, mask in zip(s.tokens[:, 0], s.mask[:, 0]):
        ends = (row == 0).nonzero()
        if len(ends):
            first = int(ends[0])
            assert (row[first:] == 0).all()
            assert mask[: first + 1].eq(1).all() and mask[first + 1 :].eq(0).all()
    assert (s.logprobs[s.mask == 0] == 0).all()
    assert (s.logprobs[s.mask == 1] < 0).all()


def test_sampling_is_seeded() -> None:
    model = make("topdown")
    ctx = model.encode(*inputs())
    torch.manual_seed(7)
    a = decoding.sample(model, ctx, 16, n=2).tokens
    torch.manual_seed(7)
    b = decoding.sample(model, ctx, 16, n=2).tokens
    assert torch.equal(a, b)


def test_unknown_arch_and_unknown_option_are_errors() -> None:
    from caprl.errors import CaprlError

    with pytest.raises(CaprlError, match="unknown model architecture 'nope'"):
        build_model("nope", {}, 5, 6, 4)
    with pytest.raises(CaprlError, match="att_hidden_size"):
        build_model("fc", {"att_hidden_size": 3}, 5, 6, 4, where="models.fc")


def test_noise_sampling_draws_from_the_model_distribution() -> None:
    """Gumbel-max with caprl's noise samples tokens with the model's probabilities."""

    class Fixed(torch.nn.Module):
        n_stages = 1

        def init_state(self, ctx):
            return (ctx["x"],)

        def step(self, words, ctx, state):
            logits = torch.tensor([0.0, 2.0, 1.0, -1.0, 0.5]).expand(words.shape[0], 1, 5)
            from caprl.models.base import StepOutput

            return StepOutput(torch.log_softmax(logits, -1), state, None, state[0][:, None])

    ctx = {"x": torch.zeros(2000, 1)}
    first = decoding.sample(Fixed(), ctx, 1, n=1, noise=decoding.Noise(seed=3, step=0, total=2000)).tokens[:, 0, 0]
    expected = torch.softmax(torch.tensor([0.0, 2.0, 1.0, -1.0, 0.5]), 0)
    observed = torch.bincount(first, minlength=5).float() / len(first)
    assert torch.allclose(observed, expected, atol=0.03), (observed, expected)
    again = decoding.sample(Fixed(), ctx, 1, noise=decoding.Noise(seed=3, step=0, total=2000)).tokens
    assert torch.equal(again[:, 0, 0], first)  # a function of (seed, step, row)
