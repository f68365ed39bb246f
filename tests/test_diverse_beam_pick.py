"""Diverse beam search's final pick, as self-critical.pytorch's (captioning/models/CaptionModel.py
``beam_search`` with ``group_size`` > 1): its ``done_beams`` are each group's beams sorted by their
selection score ``p`` (the augmented log-probability, length-penalised), the groups concatenated in
order, and ``_sample_beam`` returns ``done_beams[0]``: the first group's best caption, not the beam
of highest log-probability over all groups."""

from __future__ import annotations

import pytest
import torch

from decode_reference import diverse_groups
from decode_toy import TableModel, words_of

from caprl import decoding
from caprl.decoding import DECODERS
from caprl.decoding.options import DecodeOptions
from caprl.decoding.selection import LENGTH_PENALTIES


@pytest.mark.parametrize("width, groups, lam, penalty, alpha", [(4, 2, 1.0, "none", 0.0), (6, 3, 0.5, "none", 0.0),
                                                                 (6, 2, 2.0, "wu", 0.7)])
def test_the_beams_come_group_by_group_and_the_caption_is_the_first_groups_best(width, groups, lam, penalty, alpha):
    model, max_length = TableModel(eos_bias=-0.5), 5
    ctx = torch.linspace(0.2, 2.6, 9, dtype=torch.float64)
    opts = DecodeOptions(groups=groups, diversity_lambda=lam, length_penalty=penalty, length_alpha=alpha)
    rank = lambda s, n: float(LENGTH_PENALTIES[penalty](torch.tensor(s), torch.tensor(float(n)), alpha))  # noqa: E731
    with torch.no_grad():
        tokens, scores = decoding.beam_search(model, ctx, width, max_length, opts)
        caption = DECODERS["beam"](model, ctx, max_length, beam_size=width, groups=groups, diversity_lambda=lam,
                                   length_penalty=penalty, length_alpha=alpha)
    elsewhere = 0
    for b, image in enumerate(ctx.tolist()):
        want = diverse_groups(model, image, width, groups, lam, max_length, rank)  # no rules: every word allowed
        got = [words_of(r) for r in tokens[b].tolist()]
        assert got == [w for group in want for w, _, _ in group]  # group by group, each by its selection score
        torch.testing.assert_close(scores[b], torch.tensor([s for group in want for _, s, _ in group],
                                                           dtype=scores.dtype), rtol=1e-5, atol=1e-5)  # plain
        assert words_of(caption[b, 0].tolist()) == want[0][0][0]  # the first group's best
        elsewhere += int(scores[b].argmax()) != 0
    assert elsewhere  # some image's most likely beam lies in a later group: it is not the caption returned


def test_one_group_is_sorted_by_score_as_before():
    model = TableModel(eos_bias=-0.5)
    with torch.no_grad():
        _, scores = decoding.beam_search(model, torch.linspace(0.2, 2.6, 9, dtype=torch.float64), 4, 5)
    assert torch.equal(scores, scores.sort(dim=1, descending=True).values)
