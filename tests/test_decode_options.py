"""Evaluation's decoding options (caprl.decoding.options, issue 39): the length penalties and the
constraints against a brute-force search of a toy model's every caption, diverse beam search
against Vijayakumar et al.'s Alg. 1 read literally, and the defaults against the decoders as
they were before the options existed."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
import torch

from caprl import decoding
from caprl.decoding import DECODERS
from caprl.decoding.constraints import BAD_ENDINGS
from caprl.decoding.options import OFF, DecodeOptions, read_options
from caprl.models.base import Batch, CaptionModel, map_batch
from conftest import default_params
from decode_reference import constrained, diverse_groups
from decode_toy import BAD, WORDS, Allowed, TableModel, best_captions, every_caption, images, repeats_a_trigram, \
    step_logprobs, words_of
from toy import ending_model

V, UNK = len(WORDS), len(WORDS) - 1
RANKS: dict[str, Callable[[float, int, float], float]] = {
    "none": lambda s, n, a: s,
    "wu": lambda s, n, a: s / ((5.0 + n) / 6.0) ** a,  # Wu et al. 2016, sec. 7
    "average": lambda s, n, a: s / n,
}


def allowed(settings: dict[str, Any]) -> Allowed:
    """Whether a caption (its words) keeps the rules ``settings`` switch on."""
    def ok(words: Sequence[int]) -> bool:
        return not ((settings.get("suppress_unk") and UNK in words)
                    or (settings.get("remove_bad_endings") and words and words[-1] in BAD)
                    or (settings.get("block_trigrams") and repeats_a_trigram(words)))
    return ok


CASES = [({}, 4), ({"length_penalty": "wu", "length_alpha": 0.8}, 4), ({"length_penalty": "average"}, 4),
         ({"suppress_unk": True}, 4), ({"remove_bad_endings": True}, 4), ({"block_trigrams": True}, 5),
         ({"suppress_unk": True, "remove_bad_endings": True, "block_trigrams": True, "length_penalty": "wu",
           "length_alpha": 1.5}, 5)]


@pytest.mark.parametrize("settings, max_length", CASES)
def test_a_beam_as_wide_as_every_caption_ranks_them_as_the_brute_force_does(settings: dict[str, Any],
                                                                            max_length: int) -> None:
    """Every caption the rules allow, best first by the length penalty's score: exactly the
    brute-force enumeration's (a beam that holds every hypothesis is an exhaustive search)."""
    model = TableModel(eos_bias=-0.3)
    width = sum((V - 1) ** n for n in range(max_length + 1))  # every caption: ended at each step, or cut
    opts = read_options({**settings, "words": WORDS}, "beam", width)
    rank = RANKS[opts.length_penalty]
    with torch.no_grad():
        tokens, scores = decoding.beam_search(model, images(), width, max_length, opts)
        best = DECODERS["beam"](model, images(), max_length, beam_size=width, **settings, words=WORDS)
    changed = False
    for b, image in enumerate(images().tolist()):
        captions = every_caption(model, image, max_length)
        want = best_captions(captions, allowed(settings), lambda s, n: rank(s, n, opts.length_alpha))
        finite = torch.isfinite(scores[b])
        assert [words_of(row) for row in tokens[b][finite].tolist()] == [w for w, _ in want]
        torch.testing.assert_close(scores[b][finite], torch.tensor([s for _, s in want], dtype=torch.float64))
        assert words_of(best[b, 0].tolist()) == want[0][0]
        plain = best_captions(captions, lambda w: True, lambda s, n: s)
        changed |= [w for w, _ in plain] != [w for w, _ in want]
    assert changed or not settings  # the option matters on this toy: the test could fail


@pytest.mark.parametrize("settings", [{"suppress_unk": True}, {"remove_bad_endings": True}, {"block_trigrams": True},
                                      {"suppress_unk": True, "remove_bad_endings": True, "block_trigrams": True}])
def test_greedy_takes_the_most_likely_word_the_rules_allow(settings: dict[str, Any]) -> None:
    model, max_length = TableModel(eos_bias=-1.5, sharp=3.0), 7
    ctx = torch.linspace(0.1, 2.9, 12, dtype=torch.float64)
    with torch.no_grad():
        got = DECODERS["greedy"](model, ctx, max_length, **settings, words=WORDS)[:, 0]
        plain = DECODERS["greedy"](model, ctx, max_length)[:, 0]
    for b, image in enumerate(ctx.tolist()):
        words: list[int] = []
        for t in range(max_length):
            lp = constrained(step_logprobs(model, image, words), words, t, max_length, settings)
            w = max(range(V), key=lambda i: lp[i])
            if w == 0:
                break
            words.append(w)
        assert words_of(got[b].tolist()) == tuple(words)
    assert not all(allowed(settings)(words_of(row)) for row in plain.tolist())  # the rules change something here


@pytest.mark.parametrize("width, groups, lam, settings", [
    (6, 3, 0.5, {}), (6, 2, 2.0, {"length_penalty": "wu", "length_alpha": 0.7}),
    (4, 2, 1.0, {"length_penalty": "average", "suppress_unk": True, "remove_bad_endings": True,
                 "block_trigrams": True})])
def test_diverse_beam_search_is_the_papers_algorithm(width: int, groups: int, lam: float,
                                                     settings: dict[str, Any]) -> None:
    model, max_length = TableModel(eos_bias=-0.5), 5
    ctx = torch.linspace(0.2, 2.6, 5, dtype=torch.float64)
    opts = read_options({**settings, "groups": groups, "diversity_lambda": lam, "words": WORDS}, "beam", width)
    with torch.no_grad():
        tokens, scores = decoding.beam_search(model, ctx, width, max_length, opts)
        plain, _ = decoding.beam_search(model, ctx, width, max_length)
    rank = RANKS[opts.length_penalty]
    for b, image in enumerate(ctx.tolist()):
        beams = diverse_groups(model, image, width, groups, lam, max_length,
                               lambda s, n: rank(s, n, opts.length_alpha), settings)
        want = sorted(((w, s) for group in beams for w, s, _ in group), key=lambda c: (-c[1], c[0]))  # plain
        got = sorted(zip([words_of(r) for r in tokens[b].tolist()], scores[b].tolist()), key=lambda c: (-c[1], c[0]))
        assert [w for w, _ in got] == [w for w, _ in want]
        torch.testing.assert_close(torch.tensor([s for _, s in got]), torch.tensor([s for _, s in want]))
    assert not torch.equal(tokens, plain)  # the groups are not the plain beams


def test_diverse_groups_without_a_penalty_are_copies_of_the_narrower_beam_search() -> None:
    """lam 0 (refused in params: it means nothing) and groups 1 give back the plain search."""
    model = TableModel(eos_bias=-0.5)
    with torch.no_grad():
        copies, _ = decoding.beam_search(model, images(4), 6, 5, DecodeOptions(groups=3))
        narrow, _ = decoding.beam_search(model, images(4), 2, 5)
        one = decoding.beam_search(model, images(4), 6, 5, DecodeOptions(groups=1))
        plain = decoding.beam_search(model, images(4), 6, 5)
    for b in range(4):
        assert sorted(map(tuple, copies[b].tolist())) == sorted(map(tuple, narrow[b].tolist() * 3))
    assert torch.equal(one[0], plain[0]) and torch.equal(one[1], plain[1])


# --- the defaults decode exactly as before -------------------------------------------------------
def beam_search_before_issue_39(model: CaptionModel, ctx: Batch, beam_size: int,
                                max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """caprl.decoding.beam_search as it was before the options (git 09b80e5), verbatim but for names."""
    k = beam_size
    ctx_k = decoding.expand(ctx, k)
    state = model.init_state(ctx_k)
    first = decoding._first(ctx)
    batch, device = first.shape[0], first.device
    stop_early = device.type == "cpu"
    unreached = torch.full((batch, k), float("-inf"), device=device)
    scores = torch.cat([torch.zeros_like(unreached[:, :1]), unreached[:, 1:]], dim=1)
    finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    tokens = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    prev = torch.zeros(batch * k, dtype=torch.long, device=device)
    base = (torch.arange(batch, device=device) * k).unsqueeze(1)
    ended: torch.Tensor | None = None
    for _ in range(max_length):
        out = model.step(prev.unsqueeze(1).expand(-1, model.n_stages), ctx_k, state)
        logprobs = out.logprobs[:, -1].reshape(batch, k, -1)
        vocab = logprobs.shape[-1]
        if ended is None:
            ended = torch.cat([logprobs.new_zeros(1), logprobs.new_full((vocab - 1,), float("-inf"))])
        logprobs = torch.where(finished.unsqueeze(-1), ended, logprobs)
        top_scores, top_index = (scores.unsqueeze(-1) + logprobs).view(batch, -1).topk(k, dim=1)
        beam, word = top_index // vocab, top_index % vocab
        order = (base + beam).view(-1)
        state = map_batch(lambda t: t.index_select(0, order), out.state)
        kept = tokens.gather(1, beam.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
        tokens = torch.cat([kept, word.unsqueeze(-1)], -1)
        finished = finished.gather(1, beam) | (word == 0)
        scores = top_scores
        prev = word.view(-1)
        if stop_early and bool(finished.all()):
            break
    order = scores.argsort(dim=1, descending=True)
    tokens = tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
    return decoding._pad(tokens, max_length), scores.gather(1, order)


def test_params_yaml_holds_every_option_off_and_the_decoders_defaults_are_those() -> None:
    decode = default_params()["decode"]
    assert {k: decode[k] for k in OFF} == OFF
    assert read_options(decode, "beam", decode["beam_size"]) == DecodeOptions()
    assert set(decode) == {"method", "beam_size", "max_length", *OFF}


@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_with_params_yaml_the_captions_and_scores_are_those_before_the_options(arch: str) -> None:
    """Every decode: key passed as `caprl caption` passes them: the old beams (tokens and scores,
    bit for bit), and greedy = the old width-1 beam for a one-stage model."""
    settings = {k: v for k, v in default_params()["decode"].items() if k not in ("method", "beam_size", "max_length")}
    model = ending_model(arch).eval()
    gen = torch.Generator().manual_seed(3)
    ctx = model.encode(torch.randn(9, 8, generator=gen), torch.randn(9, 4, 8, generator=gen))
    with torch.no_grad():
        for k in (1, 3, 5):
            old = beam_search_before_issue_39(model, ctx, k, 12)
            new = decoding.beam_search(model, ctx, k, 12, read_options(settings, "beam", k))
            assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
            assert torch.equal(DECODERS["beam"](model, ctx, 12, beam_size=k, **settings), old[0][:, :1])
        assert torch.equal(DECODERS["top_k_beams"](model, ctx, 12, beam_size=4, n=3, **settings),
                           beam_search_before_issue_39(model, ctx, 4, 12)[0][:, :3])
        if model.n_stages == 1:
            assert torch.equal(DECODERS["greedy"](model, ctx, 12, **settings),
                               beam_search_before_issue_39(model, ctx, 1, 12)[0])


#: words for tests/toy.py's ending_model (12): three bad endings, UNK last
ENDING_WORDS = ["<eos>", "a", "of", "the", "red", "blue", "circle", "square", "with", "on", "big", "UNK"]


@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_real_models_keep_the_rules_in_every_decoder_and_a_cpu_decode_still_drops_ended_rows(
        arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.decoding import live_rows

    words = ENDING_WORDS
    model = ending_model(arch).eval()
    for name, p in model.named_parameters():  # every word plausible: UNK and the bad endings too
        if name.endswith("bias") and p.shape[0] == 12:
            with torch.no_grad():
                p[0] -= 1.5
    gen = torch.Generator().manual_seed(4)
    ctx = model.encode(torch.randn(24, 8, generator=gen), torch.randn(24, 4, 8, generator=gen))
    rules = {"suppress_unk": True, "remove_bad_endings": True, "block_trigrams": True, "words": words}
    shrinks: list[bool] = []
    real = live_rows.LiveRows.shrink
    monkeypatch.setattr(live_rows.LiveRows, "shrink", lambda self, *a: (lambda out: (shrinks.append(out is not None),
                                                                                     out)[1])(real(self, *a)))

    def decode(**settings: Any) -> list[torch.Tensor]:
        with torch.no_grad():
            return [DECODERS["greedy"](model, ctx, 10, **settings),
                    DECODERS["beam"](model, ctx, 10, beam_size=3, **settings),
                    DECODERS["sample"](model, ctx, 10, n=3, generator=torch.Generator().manual_seed(1), **settings)]

    def kept(outs: list[torch.Tensor]) -> bool:
        caps = [words_of(r) for out in outs for r in out.reshape(-1, 10).tolist()]
        return all(11 not in c and not (c and words[c[-1]] in BAD_ENDINGS) and not repeats_a_trigram(c) for c in caps)

    runs = []
    for at in (live_rows.SHRINK_AT, -1.0):  # -1: never shrink (every row stepped to the end)
        monkeypatch.setattr(live_rows, "SHRINK_AT", at)
        runs.append(decode(**rules))
    assert any(shrinks)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert kept(runs[0]) and not kept(decode())


RULES = {"suppress_unk": True, "remove_bad_endings": True, "block_trigrams": True, "words": ENDING_WORDS}
GPU_DECODES: dict[str, Callable[[Any, Any], torch.Tensor]] = {
    "greedy": lambda m, ctx: DECODERS["greedy"](m, ctx, 8, **RULES),
    "beam": lambda m, ctx: DECODERS["top_k_beams"](m, ctx, 8, beam_size=4, n=4, groups=2, diversity_lambda=0.5,
                                                   length_penalty="wu", length_alpha=0.7, **RULES),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a capture)")
@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
@pytest.mark.parametrize("decode", sorted(GPU_DECODES))
def test_on_cuda_a_decode_with_every_option_is_captured_and_replays_the_eager_one(arch: str, decode: str) -> None:
    """The options read nothing back: greedy and beam decodes with all of them are CUDA graphs
    (no capture fell back), replayed to the eager captions; a seeded sample reruns the same."""
    from caprl.decoding import captured

    model = ending_model(arch).cuda().eval()
    gen = torch.Generator().manual_seed(6)
    pooled, regions = torch.randn(8, 8, generator=gen).cuda(), torch.randn(8, 4, 8, generator=gen).cuda()
    with torch.no_grad():
        ctx = model.encode(pooled, regions)
        first, again = GPU_DECODES[decode](model, ctx), GPU_DECODES[decode](model, ctx)  # captured, then replayed
        captured.set_enabled(False)
        try:
            want = GPU_DECODES[decode](model, ctx)
        finally:
            captured.set_enabled(True)
        samples = [DECODERS["sample"](model, ctx, 8, n=3, top_k=4, top_p=0.9, temperature=0.8, **RULES,
                                      generator=torch.Generator(device="cuda").manual_seed(1)) for _ in range(2)]
    assert torch.equal(first, want) and torch.equal(again, want)
    graphs = captured._graphs[model]
    assert graphs and all(g is not captured._FAILED for g in graphs.values())
    assert torch.equal(samples[0], samples[1])


def test_evaluation_passes_decode_options_to_its_decoders_and_shares_beams_only_without_them() -> None:
    """``caprl evaluate`` gives its decoders the ``decode:`` options they read (with the vocabulary
    and, for sampling, a generator seeded from params ``seed``), nothing where all are off; the
    diversity's bs set reuses the evaluated beam search only when no option changes that search."""
    import types

    from caprl.evaluation.run import option_settings, shares_the_beams
    from caprl.evaluation.settings import EvalSettings
    from conftest import default_params

    params = default_params()
    settings = EvalSettings.from_params(params)
    data = types.SimpleNamespace(vocab=types.SimpleNamespace(idx_to_word=["<eos>", "a", "UNK"]))
    decode = dict(params["decode"])
    assert option_settings(settings, decode, "beam", data, torch.device("cpu")) == {}
    assert shares_the_beams(settings, {**decode, "beam_size": params["evaluate"]["diversity"]["beams"]})
    decode.update(block_trigrams=True, length_penalty="wu", length_alpha=0.7)
    got = option_settings(settings, decode, "beam", data, torch.device("cpu"))
    assert got["block_trigrams"] and got["length_penalty"] == "wu" and got["words"] == ["<eos>", "a", "UNK"]
    assert "top_p" not in got  # a beam search reads no sampling option
    assert not shares_the_beams(settings, {**decode, "beam_size": params["evaluate"]["diversity"]["beams"]})
    greedy = option_settings(settings, decode, "greedy", data, torch.device("cpu"))
    assert set(greedy) == {"block_trigrams", "suppress_unk", "remove_bad_endings", "words"}
    sample = option_settings(settings, {**params["decode"], "method": "sample", "top_p": 0.9}, "sample", data,
                             torch.device("cpu"))
    assert sample["top_p"] == 0.9 and sample["generator"].initial_seed() == params["seed"]
