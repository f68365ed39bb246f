"""Evaluation's sampling options (top-k, nucleus, temperature, a seeded generator), the refusals of
option combinations that mean nothing, and the schema of the ``decode:`` keys (issue 39)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from caprl import decoding, params as params_mod
from caprl.decoding import DECODERS
from caprl.decoding import lookahead  # noqa: F401  (registers the lookahead decoder)
from caprl.decoding.constraints import Constraints
from caprl.decoding.options import options_problem, settings_for
from caprl.decoding.sampling import GeneratorNoise, sampling_rule
from caprl.errors import CaprlError
from caprl.models.base import StepOutput
from conftest import default_params
from decode_toy import TableModel, images, step_logprobs, words_of

#: a first word's distribution, in no particular order: sorted, 0.40 (3), 0.25 (1), 0.15 (5), 0.10 (2), ...
PROBS = [0.04, 0.25, 0.10, 0.40, 0.06, 0.15]


class FixedModel:
    """Every step's distribution is :data:`PROBS`, for every row."""

    n_stages = 1

    def init_state(self, ctx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (ctx,)

    def step(self, words: torch.Tensor, ctx: torch.Tensor, state: tuple[torch.Tensor, ...]) -> StepOutput:
        lp = torch.tensor(PROBS, dtype=torch.float64).log().expand(words.shape[0], -1)
        return StepOutput(lp.unsqueeze(1), state, None, lp.unsqueeze(1))


@pytest.mark.parametrize("top_k, top_p, temperature, support", [
    (3, 1.0, 1.0, {3, 1, 5}),  # the 3 most likely
    (0, 0.6, 1.0, {3, 1}),  # 0.40 + 0.25 >= 0.6: the fewest whose mass reaches p (Holtzman et al.)
    (0, 0.66, 1.0, {3, 1, 5}),  # 0.65 < 0.66: one more
    (0, 0.3, 1.0, {3}),  # the most likely word alone already holds p
    (2, 0.9, 1.0, {3, 1}),  # top-k, then top-p of what is left (renormalised: 0.62, 0.38)
    (0, 0.8, 0.5, {3, 1}),  # at temperature 0.5 the probabilities are p^2 / sum: 0.60, 0.23, ...
    (0, 1.0, 1.0, set(range(6))),
])
def test_sampled_words_are_the_support_with_the_renormalised_probabilities(
        top_k: int, top_p: float, temperature: float, support: set[int]) -> None:
    n = 6000
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        out = decoding.sample(FixedModel(), torch.zeros(1, dtype=torch.float64), 1, n=n, temperature=temperature,
                              noise=GeneratorNoise(gen), rule=sampling_rule(Constraints(), top_k, top_p))
    words, logprobs = out.tokens[:, 0, 0], out.logprobs[:, 0, 0]
    tempered = [p ** (1 / temperature) for p in PROBS]
    want = {w: tempered[w] / sum(tempered[v] for v in support) for w in support}
    assert set(words.tolist()) == support
    torch.testing.assert_close(logprobs, torch.tensor([math.log(want[w]) for w in words.tolist()], dtype=torch.float64),
                               atol=1e-12, rtol=1e-12)
    for w, p in want.items():  # and they are drawn at those rates (5 sigma)
        assert abs(float((words == w).double().mean()) - p) <= 5 * math.sqrt(p * (1 - p) / n), w


def test_every_word_of_a_truncated_sample_is_in_its_steps_support() -> None:
    """Along whole captions of a prefix-dependent toy: each word is among the step's top_k of the
    tempered distribution and inside its nucleus (brute force from the step's log-probabilities)."""
    model, ctx, top_k, top_p, temperature = TableModel(eos_bias=-1.0), images(8), 3, 0.8, 0.7
    with torch.no_grad():
        tokens = DECODERS["sample"](model, ctx, 6, n=10, top_k=top_k, top_p=top_p, temperature=temperature,
                                    generator=torch.Generator().manual_seed(2))
    unlikely = 0
    for b, image in enumerate(ctx.tolist()):
        for row in tokens[b].tolist():
            caption = [*words_of(row), 0] if len(words_of(row)) < 6 else list(words_of(row))
            for t, w in enumerate(caption):
                p = [math.exp(x / temperature) for x in step_logprobs(model, image, caption[:t])]
                order = sorted(range(len(p)), key=lambda i: -p[i])[:top_k]
                kept = [p[i] / sum(p[j] for j in order) for i in order]
                nucleus = [i for r, i in enumerate(order) if sum(kept[:r]) < top_p]
                assert w in nucleus, (row, t)
                unlikely += w != order[0]
    assert unlikely > 0  # not greedy: other words were drawn


def test_a_seeded_sample_decode_reruns_the_same_captions_and_another_seed_does_not() -> None:
    model, ctx = TableModel(eos_bias=-0.5), images(6)

    def run(seed: int) -> torch.Tensor:
        with torch.no_grad():
            return DECODERS["sample"](model, ctx, 6, n=4, top_k=3, top_p=0.9, temperature=0.8,
                                      generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(5), run(5)) and not torch.equal(run(5), run(6))


REFUSED = [
    ({"method": "beam", "beam_size": 5, "groups": 2, "diversity_lambda": 0.5},
     "decode.groups: 2 groups do not divide the 5 beams"),
    ({"method": "beam", "beam_size": 4, "groups": 2}, "decode.diversity_lambda: 0.0 with 2 group(s)"),
    ({"method": "beam", "beam_size": 4, "diversity_lambda": 0.5}, "decode.diversity_lambda: 0.5 with 1 group(s)"),
    ({"method": "sample", "top_p": 0.0}, "decode.top_p: 0.0: the nucleus' mass must be in (0, 1]"),
    ({"method": "sample", "top_p": 1.5}, "decode.top_p: 1.5: the nucleus' mass must be in (0, 1]"),
    ({"method": "sample", "top_k": -1}, "decode.top_k: -1"),
    ({"method": "sample", "temperature": 0.0}, "decode.temperature: 0.0: must be > 0"),
    ({"method": "beam", "beam_size": 5, "top_k": 40}, "decode.top_k: 40, but the beam decoder (decode.method) does not "
                                                      "read it (set it back to 0; decoders that read it: sample)"),
    ({"method": "greedy", "length_penalty": "wu", "length_alpha": 0.6}, "decode.length_penalty: 'wu', but the greedy"),
    ({"method": "lookahead", "beam_size": 5, "suppress_unk": True}, "decode.suppress_unk: True, but the lookahead"),
    ({"method": "beam", "beam_size": 5, "length_penalty": "gnmt"},
     "decode.length_penalty: unknown length penalty 'gnmt'; registered: average, none, wu"),
    ({"method": "beam", "beam_size": 5, "length_penalty": "average", "length_alpha": 0.5},
     "decode.length_alpha: 0.5: only length_penalty wu has an alpha"),
]


@pytest.mark.parametrize("decode, expected", REFUSED)
def test_nonsense_combinations_are_refused_naming_the_key(decode: dict[str, Any], expected: str) -> None:
    """By :func:`options_problem` (for a plan) and by the decoder itself, in the same words."""
    assert expected in (options_problem(decode) or "")
    model = TableModel()
    settings = {k: v for k, v in decode.items() if k != "method"}
    with pytest.raises(CaprlError, match=re.escape(expected)), torch.no_grad():
        DECODERS[decode["method"]](model, images(), 4, **settings)


def test_bad_endings_need_the_vocabulary_and_a_second_decode_takes_only_what_it_reads() -> None:
    with pytest.raises(CaprlError, match=re.escape("decode.remove_bad_endings: the greedy decoder was not given the "
                                                   "vocabulary's words")), torch.no_grad():
        DECODERS["greedy"](TableModel(), images(), 4, remove_bad_endings=True)
    decode = {**default_params()["decode"], "groups": 5, "diversity_lambda": 0.5, "suppress_unk": True}
    assert options_problem(decode) is None
    assert settings_for("greedy", decode) == {"block_trigrams": False, "suppress_unk": True,
                                              "remove_bad_endings": False}
    assert options_problem({**settings_for("greedy", decode), "method": "greedy"}) is None
    assert "decode.groups" in (options_problem({**decode, "method": "greedy"}) or "")


@pytest.mark.parametrize("edit, expected", [
    (lambda p: p["decode"].__setitem__("top_p", 1.5), "key 'decode.top_p'"),
    (lambda p: p["decode"].__setitem__("top_p", 0), "key 'decode.top_p'"),
    (lambda p: p["decode"].__setitem__("groups", 0), "key 'decode.groups'"),
    (lambda p: p["decode"].__setitem__("temperature", 0), "key 'decode.temperature'"),
    (lambda p: p["decode"].__setitem__("top_k", 2.5), "key 'decode.top_k'"),
    (lambda p: p["decode"].__setitem__("diversity_lambda", -1), "key 'decode.diversity_lambda'"),
    (lambda p: p["decode"].__setitem__("suppress_unk", "yes"), "key 'decode.suppress_unk'"),
    (lambda p: p["decode"].__setitem__("length_penalty", 0.6), "key 'decode.length_penalty'"),
    (lambda p: p["decode"].pop("block_trigrams"), "'block_trigrams' is a required property"),
    (lambda p: p["runs"]["fc-xe"].__setitem__("decode", {"top_p": 0}), "key 'runs.fc-xe.decode.top_p'"),
    (lambda p: p["runs"]["fc-xe"].__setitem__("decode", {"length_alpha": -0.5}),
     "key 'runs.fc-xe.decode.length_alpha'"),
])
def test_the_schema_checks_the_decode_options(write_params, edit, expected: str) -> None:
    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=re.escape(expected)):
        params_mod.load(write_params(params))


def test_a_run_may_set_its_own_decode_options(write_params) -> None:
    params = default_params()
    params["runs"]["fc-xe"]["decode"] = {"groups": 5, "diversity_lambda": 0.5, "block_trigrams": True}
    loaded = params_mod.load(write_params(params))
    spec = params_mod.run_spec(loaded, "fc-xe")
    assert spec.decode["groups"] == 5 and spec.decode["block_trigrams"] and spec.decode["top_p"] == 1.0
    assert options_problem(spec.decode, "runs.fc-xe.decode") is None
