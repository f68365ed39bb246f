"""Reward-hacking signs of a run's captions (caprl.evaluation.failure_modes) by hand: bad endings
(self-critical.pytorch's list), seq-rep-2 (Welleck et al. 2020) and the mean length."""

from __future__ import annotations

import pytest

from caprl.errors import CaprlError
from caprl.evaluation.failure_modes import failure_modes, seq_rep


def test_seq_rep_2_by_hand() -> None:
    assert seq_rep("a man with a man with a".split()) == pytest.approx(1 - 3 / 6)  # (a man)(man with)(with a) x2
    assert seq_rep("a dog runs".split()) == 0.0
    assert seq_rep(["a"]) == 0.0 and seq_rep([]) == 0.0  # no pair: no repeat
    assert seq_rep("a a a a".split()) == pytest.approx(1 - 1 / 3)


def test_failure_modes_by_hand() -> None:
    captions = {1: "a man riding a", 2: "a dog on the grass", 3: "two cats sitting with", 4: "",
                5: "a man with a man with a"}
    out = failure_modes(captions)
    assert out["bad_ending_captions"] == 3  # 'a', 'with', 'a'; the empty caption has no last word
    assert out["bad_endings"] == pytest.approx(3 / 5)
    assert out["mean_length"] == pytest.approx((4 + 5 + 4 + 0 + 7) / 5)
    assert out["repeated_bigrams"] == pytest.approx((0 + 0 + 0 + 0 + 0.5) / 5)
    assert out["captions"] == 5


def test_no_captions_is_an_error() -> None:
    with pytest.raises(CaprlError, match="no captions"):
        failure_modes({})


@pytest.mark.numerics
def test_caption_kl_is_the_summed_per_step_kl_by_hand() -> None:
    """caprl.evaluation.start_kl.caption_kl against a loop over the vocabulary (float64), 0 against
    itself, and only the caption's steps (words and the end token) counted."""
    import torch

    from caprl.evaluation.start_kl import caption_kl
    from numerics import assert_float64_close, to_float64
    from toy import ending_model

    torch.manual_seed(0)
    model, start = to_float64(ending_model("fc").eval(), ending_model("topdown").eval())
    pooled, regions = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    tokens = torch.tensor([[3, 5, 2, 0], [4, 0, 0, 0], [1, 2, 3, 4]])  # lengths 3, 1, 4 (cut: no end token)
    got = caption_kl(model, start, pooled, regions, tokens)
    with torch.no_grad():
        lp = model.teacher_forcing(model.encode(pooled, regions), tokens)[:, 0]
        lq = start.teacher_forcing(start.encode(pooled, regions), tokens)[:, 0]
    for i, length in enumerate([3, 1, 4]):
        by_hand = sum(float(lp[i, t, v].exp() * (lp[i, t, v] - lq[i, t, v]))
                      for t in range(length + 1) for v in range(lp.shape[-1]))
        assert_float64_close(got[i], torch.tensor(by_hand, dtype=torch.float64))
    assert bool((got > 0).all())
    assert float(caption_kl(model, model, pooled, regions, tokens).abs().max()) == 0.0
