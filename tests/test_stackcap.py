"""LSTM3, Soft-Att, Stack-Cap* and Stack-Cap: structure, eq. 8, XE gradients, beam search, tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from caprl import decoding
from caprl.models import build_model
from caprl.models.attention import attend
from caprl.objectives import Batch, ObjectiveEnv, build_objective
from caprl.tables import paper_numbers
from caprl.tables.render import Cell
from caprl.tables.stackcap import figure_note, matching_runs, stackcap_table1, stackcap_table2, stackcap_table3
from numerics import assert_float64_close, assert_summation_close, to_float64
from toy import CONSTANT_LR

SIZES = {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}
ATT = {"att_hidden_size": 12}
OPTIONS = {"lstm3": {}, "softatt": ATT, "stackcap_star": ATT, "stackcap": ATT}
STACKED = ["stackcap_star", "stackcap"]
VOCAB, FEAT, REGIONS = 11, 6, 4


def make(arch: str, dropout: float = 0.0, **extra: int):
    torch.manual_seed(0)
    options = {**SIZES, **OPTIONS[arch], "dropout": dropout, **extra}
    return build_model(arch, options, vocab_size=VOCAB, feat_dim=FEAT, n_regions=REGIONS)


def inputs(batch: int = 3):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(batch, FEAT, generator=gen), torch.randn(batch, REGIONS, FEAT, generator=gen)


# --------------------------------------------------------------------------- structure

@pytest.mark.parametrize(("arch", "stages"), [("lstm3", 1), ("softatt", 1), ("stackcap_star", 3), ("stackcap", 3)])
def test_stages_and_step_shapes(arch: str, stages: int) -> None:
    model = make(arch).eval()
    ctx = model.encode(*inputs())
    out = model.step(torch.zeros(3, stages, dtype=torch.long), ctx, model.init_state(ctx))
    assert model.n_stages == stages
    assert out.logprobs.shape == (3, stages, VOCAB)
    assert torch.allclose(out.logprobs.exp().sum(-1), torch.ones(3, stages), atol=1e-5)
    if arch == "lstm3":
        assert out.attention is None
    else:
        assert out.attention.shape == (3, stages, REGIONS)


@pytest.mark.parametrize("arch", STACKED)
def test_coarse_stage_has_no_attention_and_fine_stages_do(arch: str) -> None:
    model = make(arch, n_fine=3).eval()
    assert model.n_stages == 4 and len(model.fine) == 3 and len(model.logits) == 4
    ctx = model.encode(*inputs())
    out = model.step(torch.tensor([[0, 1, 2, 3]] * 3), ctx, model.init_state(ctx))
    assert (out.attention[:, 0] == 0).all()
    assert torch.allclose(out.attention[:, 1:].sum(-1), torch.ones(3, 3), atol=1e-5)


def test_lstm3_reads_the_image_first_and_stacks_three_lstms() -> None:
    model = make("lstm3").eval()
    pooled, regions = inputs()
    state_a = model.init_state(model.encode(pooled, regions))
    state_b = model.init_state(model.encode(pooled + 1.0, regions))
    assert len(state_a) == 6 and not torch.allclose(state_a[4], state_b[4])
    assert [lstm.input_size for lstm in model.lstms] == [8, 16, 16]


def test_softatt_attends_from_the_previous_hidden_state() -> None:
    model = make("softatt").eval()
    ctx = model.encode(*inputs())
    state = model.init_state(ctx)
    seen = []
    model.attention.register_forward_hook(lambda mod, args, out: seen.append(args[2].clone()))
    out = model.step(torch.ones(3, 1, dtype=torch.long), ctx, state)
    assert torch.equal(seen[0], state[0])  # h_{t-1}, not h_t
    model.step(torch.ones(3, 1, dtype=torch.long), ctx, out.state)
    assert torch.equal(seen[1], out.state[0])


def test_each_stage_reads_its_own_previous_word() -> None:
    model = make("stackcap").eval()
    ctx = model.encode(*inputs())
    state = model.init_state(ctx)
    a = model.step(torch.tensor([[1, 2, 3]] * 3), ctx, state)
    b = model.step(torch.tensor([[1, 2, 4]] * 3), ctx, state)  # only the last stage's word differs
    assert torch.equal(a.logprobs[:, :2], b.logprobs[:, :2])
    assert not torch.allclose(a.logprobs[:, 2], b.logprobs[:, 2])


# --------------------------------------------------------------------------- eq. 8

@pytest.mark.numerics
def test_stacked_query_is_h_plus_previous_attended_feature_by_hand() -> None:
    model, pooled, regions = to_float64(make("stackcap").eval(), *inputs())  # by hand: other kernels
    ctx = model.encode(pooled, regions)
    h, alpha = to_float64(torch.randn(3, 16), torch.softmax(torch.randn(3, REGIONS), dim=-1))
    att1 = model.attend[0]  # stage 1's W_{v alpha}, b_{v alpha}
    by_hand = h + torch.einsum("bn,bnh->bh", alpha, regions @ att1.w_value.weight.T + att1.w_value.bias)
    g = attend(alpha, ctx["values"][0])  # stage 1's attended feature g^1
    assert_float64_close(model.attention_query(h, g), by_hand)
    assert torch.equal(model.attention_query(h, None), h)  # alpha^0 = 0: hbar^0 = h^0


@pytest.mark.parametrize("arch", STACKED)
def test_only_stacked_attention_depends_on_the_previous_stage_weights(arch: str) -> None:
    """Same h^{1}_t, two different alpha^{1}_t: stage 2's attention changes only for Stack-Cap."""
    model = make(arch).eval()
    ctx = model.encode(*inputs())
    h = torch.randn(3, 16)
    sharp = torch.eye(REGIONS)[:3]
    flat = torch.full((3, REGIONS), 1.0 / REGIONS)
    stage1 = lambda alpha: attend(alpha, ctx["values"][0])  # noqa: E731  (g^1_t)
    g_a, alpha_a = model.attend_stage(2, ctx, h, stage1(sharp))
    g_b, alpha_b = model.attend_stage(2, ctx, h, stage1(flat))
    changed = not torch.allclose(alpha_a, alpha_b)
    assert changed == (arch == "stackcap")
    assert (not torch.allclose(g_a, g_b)) == (arch == "stackcap")


@pytest.mark.numerics
@pytest.mark.parametrize("arch", STACKED)
def test_step_queries_stage_two_with_hbar(arch: str) -> None:
    """Inside a real step, stage 2's query is h^1_t (+ g^1_t for Stack-Cap, eq. 8)."""
    model = make(arch).eval()
    ctx = model.encode(*inputs())
    stage1, query2 = [], []
    model.attend[0].register_forward_hook(lambda mod, args, out: stage1.append(out))
    model.attend[1].register_forward_hook(lambda mod, args, out: query2.append(args[2]))
    state = model.init_state(ctx)
    for _ in range(2):
        out = model.step(torch.tensor([[1, 2, 3]] * 3), ctx, state)
        state = out.state
    h1, g1 = state[1], stage1[-1][0]  # the state: (h^0, h^1, h^2, c^0, c^1, c^2)
    expected = h1 + g1 if arch == "stackcap" else h1
    assert torch.equal(query2[-1], expected)  # bit-identical: the step's own sum of the same two tensors
    assert torch.equal(out.attention[:, 1], stage1[-1][1])


# --------------------------------------------------------------------------- XE gradients

def xe_batch(n_images: int = 2) -> Batch:
    pooled, regions = inputs(n_images)
    labels = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]] * n_images)
    return Batch(list(range(n_images)), pooled, regions, labels, torch.arange(n_images).repeat_interleave(2))


@pytest.mark.numerics
@pytest.mark.parametrize("arch", sorted(OPTIONS))
def test_xe_gives_every_parameter_a_gradient(arch: str) -> None:
    model = make(arch, dropout=0.1).train()
    env = ObjectiveEnv(decode_words=lambda t: [], reward=lambda name: None, max_length=6)
    loss, metrics = build_objective("xe", {"lr": 1e-3, "epochs": 1, **CONSTANT_LR}, env, model).loss(model, xe_batch())
    loss.backward()
    for name, p in model.named_parameters():
        if name == "embed.weight":  # only the rows of words that occur
            assert p.grad[[0, 1, 2, 3, 4, 5]].abs().sum() > 0
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if model.n_stages > 1:
        assert set(metrics) == {"xe", "xe_stage0", "xe_stage1", "xe_stage2"}
        stages = [metrics[f"xe_stage{s}"] for s in range(3)]  # the loss sums the 3 stages' losses in float32
        assert_summation_close(loss.detach(), torch.tensor(sum(stages)), n=3, magnitude=max(map(abs, stages)))


# --------------------------------------------------------------------------- beam search

def tied_greedy(model, ctx, max_length: int) -> torch.Tensor:
    """Greedy on the last stage with every stage fed the last stage's word (what beam width 1 does)."""
    state = model.init_state(ctx)
    prev = torch.zeros(ctx["mean"].shape[0], dtype=torch.long)
    done = torch.zeros_like(prev, dtype=torch.bool)
    words = []
    for _ in range(max_length):
        out = model.step(prev.unsqueeze(1).expand(-1, model.n_stages), ctx, state)
        state = out.state
        prev = out.logprobs[:, -1].argmax(-1).masked_fill(done, 0)
        words.append(prev)
        done = done | (prev == 0)
    return torch.stack(words, dim=1)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", STACKED)
def test_beam_width_one_is_the_last_stage_greedy_with_tied_words(arch: str) -> None:
    model = make(arch).eval()
    ctx = model.encode(*inputs(5))
    beam, _ = decoding.beam_search(model, ctx, 1, 12)
    assert torch.equal(beam[:, 0], tied_greedy(model, ctx, 12))


@pytest.mark.numerics
@pytest.mark.parametrize("arch", STACKED)
def test_beam_scores_are_the_last_stage_logprobs(arch: str) -> None:
    model, *images = to_float64(make(arch).eval(), *inputs(4))  # beam steps against teacher forcing
    ctx = model.encode(*images)
    tokens, scores = decoding.beam_search(model, ctx, 3, 12)
    best = tokens[:, 0]
    logprobs = model.teacher_forcing(ctx, best)  # [B, S, T+1, V], every stage fed the hypothesis
    lengths = (best > 0).sum(1)
    for b in range(best.shape[0]):
        n = int(lengths[b])
        targets = torch.cat([best[b, :n], best.new_zeros(1)]) if n < best.shape[1] else best[b]
        per_stage = logprobs[b, :, torch.arange(len(targets)), targets].sum(-1)
        assert_float64_close(per_stage[-1], scores[b, 0])
        assert not torch.isclose(per_stage[0], scores[b, 0], atol=1e-4)  # not the coarse stage's


# --------------------------------------------------------------------------- tables

def table_params() -> dict:
    return {
        "datasets": {"synthetic": {"enabled": True}, "coco": {"enabled": True}},
        "evaluate": {"split": "test", "greedy": False, "diversity": {"methods": [], "samples": 5, "beams": 5, "examples": 2}}, "decode": {"method": "beam", "beam_size": 5},
        "models": {"fc_lstm": {"arch": "fc", "cell": "lstm"}, "fc": {"arch": "fc", "cell": "maxout"},
                   "stackcap": {"arch": "stackcap"}, "stackcap_star": {"arch": "stackcap_star"},
                   "topdown": {"arch": "topdown"}},
        "objectives": {"xe": {}, "scst": {}, "c2f": {}},
        "runs": {"a-xe": {"method": "xe", "model": "fc_lstm"}, "b-xe": {"method": "xe", "model": "stackcap"},
                 "c-xe": {"method": "xe", "model": "stackcap_star"},
                 "e-xe": {"method": "xe", "model": "fc"},  # Rennie et al.'s FC: not the paper's LSTM
                 "a-rl": {"method": "scst", "model": "fc_lstm", "init": {"model": "a-xe"}},
                 "b-rl": {"method": "c2f", "model": "stackcap", "init": {"model": "b-xe"}},
                 "b-rl2": {"method": "scst", "model": "stackcap", "init": {"model": "b-xe"}}},
    }


def scores_of(*runs: str) -> dict:
    metrics = {"BLEU-1": 0.5, "BLEU-2": 0.4, "BLEU-3": 0.3, "BLEU-4": 0.2, "METEOR": 0.25, "ROUGE-L": 0.45,
               "CIDEr-D": 1.1}
    return {r: {"run": r, "metrics": metrics, "unavailable": {"SPICE": "no Java"}} for r in runs}


def test_rows_are_found_by_model_and_method_not_by_name() -> None:
    params = table_params()
    assert matching_runs(params, "synthetic", "fc_lstm", "xe") == ["a-xe"]  # not e-xe: another model of arch fc
    assert matching_runs(params, "synthetic", "stackcap", "xe") == ["b-xe"]
    assert matching_runs(params, "synthetic", "stackcap", "c2f") == ["b-rl"]
    assert matching_runs(params, "synthetic", "topdown", "xe") == []
    params["runs"]["b-rl"]["datasets"] = ["coco"]  # trains on coco only: not a row of the synthetic tables
    assert matching_runs(params, "synthetic", "stackcap", "c2f") == []
    assert matching_runs(params, "coco", "stackcap", "c2f") == ["b-rl"]


def test_tables_on_synthetic_show_ours_and_missing_runs_as_missing() -> None:
    params, scores = table_params(), scores_of("a-xe", "b-xe", "b-rl")
    t1 = stackcap_table1(params, "synthetic", scores)
    rows = dict(t1.rows)
    assert list(rows) == ["LSTM (XE)", "LSTM3 layers (XE)", "LSTM+Att_Soft (XE)", "LSTM+Att_Top-Down (XE)",
                          "Stack-Cap* (XE)", "Stack-Cap (XE)"]
    assert rows["Stack-Cap (XE)"][5].ours == pytest.approx(110.0)
    assert all(c.ours is None and c.paper is None for c in rows["Stack-Cap* (XE)"])  # run defined, no scores
    assert all(c.ours is None for c in rows["LSTM3 layers (XE)"])
    assert "—" in t1.markdown() and "paper" not in t1.markdown()
    t2 = dict(stackcap_table2(params, "synthetic", scores).rows)
    assert t2["Stack-Cap (C2F)"][0].ours == pytest.approx(50.0)
    t3 = stackcap_table3(params, "synthetic", scores)
    assert [label for label, _ in t3.rows] == ["Stack-Cap (C2F), ours"]
    assert t3.columns == ["B@1", "B@2", "B@3", "B@4", "M", "R", "C", "S"]
    assert t3.rows[0][1][5].ours == pytest.approx(45.0) and t3.rows[0][1][7].ours is None
    assert any("SPICE: not computed (no Java)" in n for n in t3.notes)


def test_tables_on_coco_carry_the_paper_numbers() -> None:
    params, scores = table_params(), scores_of("b-rl")
    t2 = dict(stackcap_table2(params, "coco", scores).rows)
    cell = t2["Stack-Cap (C2F)"][5]
    assert cell.paper == 120.4 and cell.ours == pytest.approx(110.0)
    assert t2["LSTM3 layers (SCST, CIDEr)"][0] == Cell(None, 73.0)
    t1 = dict(stackcap_table1(params, "coco", scores).rows)
    assert [c.paper for c in t1["Stack-Cap* (XE)"]] == [75.6, 59.6, 45.6, 34.6, 26.3, 108.0]
    t3 = stackcap_table3(params, "coco", scores)
    assert len(t3.rows) == len(paper_numbers.TABLE3_PRIOR) + 1
    nic = t3.rows[0][1]
    assert nic[3] == Cell(None, 27.7) and nic[0] == Cell(None, None)
    ours = t3.rows[-1][1]
    assert [c.paper for c in ours] == [78.6, 62.5, 47.9, 36.1, 27.4, 56.9, 120.4, 20.9]
    assert "(paper 120.4, -10.4)" in stackcap_table3(params, "coco", scores).markdown()


def test_several_runs_of_one_row_are_named() -> None:
    params = table_params()
    params["runs"]["d-xe"] = {"method": "xe", "model": "stackcap"}
    labels = [label for label, _ in stackcap_table1(params, "synthetic", {}).rows]
    assert "Stack-Cap (XE) [b-xe]" in labels and "Stack-Cap (XE) [d-xe]" in labels


def test_figure_note_links_the_pngs_relative_to_the_tables(tmp_path: Path) -> None:
    figures, tables = tmp_path / "results" / "figures" / "coco" / "attention", tmp_path / "results" / "tables"
    assert figure_note(figures, tables) == []
    figures.mkdir(parents=True)
    for k in (10, 2):
        (figures / f"attention_{k}.png").write_bytes(b"png")
    note = figure_note(figures, tables)[-1]
    assert note == ("![attention maps 2](../figures/coco/attention/attention_2.png) "
                    "![attention maps 10](../figures/coco/attention/attention_10.png)")
