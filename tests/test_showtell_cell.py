"""Show-Tell's recurrence (``cell``): self-critical.pytorch's maxout LSTMCore, Rennie et al.'s FC model
(``maxout``: the config's default and params.yaml's), or Vinyals et al.'s LSTM (``lstm``); and the
checkpoints written before the option existed, whose Show-Tell was that LSTM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from caprl.errors import CaprlError
from caprl.models import build_model, checkpoint, timeshared
from caprl.models.fc import MaxoutLSTMCell
from numerics import assert_float64_close, to_float64

SIZES = {"embed_size": 6, "hidden_size": 10, "dropout": 0.0}


@pytest.mark.numerics
def test_maxout_cell_is_scps_lstm_core_by_hand() -> None:
    """SCP's LSTMCore: all = i2h(x) + h2h(h); i, f, o = sigmoid of the first three chunks;
    c' = f c + i max(chunk 4, chunk 5); h' = o tanh(c'). (By hand: other kernels, in float64.)"""
    torch.manual_seed(0)
    cell = MaxoutLSTMCell(6, 10)
    cell, x, h, c = to_float64(cell, torch.randn(4, 6), torch.randn(4, 10), torch.randn(4, 10))
    with torch.no_grad():
        h2, c2 = cell(x, (h, c))
        pre = x @ cell.i2h.weight.T + cell.i2h.bias + h @ cell.h2h.weight.T + cell.h2h.bias
        gates = torch.sigmoid(pre[:, :30])
        i, f, o = gates[:, :10], gates[:, 10:20], gates[:, 20:30]
        want_c = f * c + i * torch.max(pre[:, 30:40], pre[:, 40:50])
    assert_float64_close(c2, want_c)
    assert_float64_close(h2, o * torch.tanh(want_c))


@pytest.mark.parametrize("cell", ["lstm", "maxout"])
def test_show_tell_trains_with_either_cell(cell: str) -> None:
    torch.manual_seed(0)
    model = build_model("fc", {**SIZES, "cell": cell}, 12, 5, 4)
    assert type(model.lstm).__name__ == ("LSTMCell" if cell == "lstm" else "MaxoutLSTMCell")
    ctx = model.encode(torch.randn(3, 5), torch.randn(3, 4, 5))
    words = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0]])
    timeshared.reset(model)
    loss = -model.teacher_forcing(ctx, words).sum()
    loss.backward()
    timeshared.check(model)  # every taped use of the cell's weights reached by the backward
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.lstm.parameters())


def test_unknown_cell_is_named() -> None:
    with pytest.raises(CaprlError, match="cell 'gru'"):
        build_model("fc", {**SIZES, "cell": "gru"}, 12, 5, 4)


def test_the_demo_and_recipes_train_rennie_et_als_fc_model() -> None:
    """The cause of the SCST gap against self-critical.pytorch's trainer (benchmarks/README.md, "SCST
    against self-critical.pytorch's own trainer"): caprl's Show-Tell had a tanh LSTM where Rennie et
    al.'s FC model and SCP have the maxout input transform. params.yaml's fc, and every recipe's fc
    (its own cell, or params.yaml's where it sets none), must build the maxout cell."""
    import yaml

    from conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    sizes = {k: v for k, v in params["models"]["fc"].items() if k != "arch"}
    assert type(build_model("fc", sizes, 12, 5, 4).lstm) is MaxoutLSTMCell
    for recipe in sorted((REPO / "configs" / "recipes").glob("*.yaml")):
        fc = (yaml.safe_load(recipe.read_text()).get("models") or {}).get("fc")
        if fc:
            assert fc.get("cell", sizes["cell"]) == "maxout", recipe.name


def written_before_the_cell_option(path: Path, cell: str) -> torch.nn.Module:
    """A real checkpoint file of a Show-Tell with ``cell``, as caprl wrote them before ``cell`` existed
    (0478804): the same format, the caption model's options without the key. Returns the model."""
    torch.manual_seed(0)
    model = build_model("fc", {**SIZES, "cell": cell}, 12, 5, 4)
    record = checkpoint.model_record(model, "fc")
    payload = checkpoint.Checkpoint(run={"name": "fc-xe", "method": "xe", "model": "fc"},
                                    modules={checkpoint.MODEL: record}, vocab_sha256="v" * 64).to_payload()
    del payload["modules"][checkpoint.MODEL]["options"]["cell"]
    checkpoint.save_payload(path, payload)
    assert "cell" not in torch.load(path, weights_only=True)["modules"][checkpoint.MODEL]["options"]
    return model


def test_a_checkpoint_from_before_the_cell_option_loads_as_the_lstm_it_was_trained_with(tmp_path: Path) -> None:
    """Before 0478804 Show-Tell's recurrence was torch's LSTMCell (benchmarks/README.md: "caprl's
    Show-Tell had torch's LSTM cell"); today's default, maxout, would not take its weights."""
    old = written_before_the_cell_option(tmp_path / "best.pt", "lstm")
    loaded = checkpoint.load(tmp_path / "best.pt")
    assert loaded.module(checkpoint.MODEL).options["cell"] == "lstm"
    model = checkpoint.model_from_checkpoint(loaded)
    assert type(model.lstm) is torch.nn.LSTMCell
    assert all(torch.equal(value, old.state_dict()[key]) for key, value in model.state_dict().items())
    pooled, regions = torch.randn(3, 5), torch.randn(3, 4, 5)
    words = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0]])
    with torch.no_grad():
        want = old.eval().teacher_forcing(old.encode(pooled, regions), words)
        got = model.eval().teacher_forcing(model.encode(pooled, regions), words)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_cell_less_checkpoint_without_the_lstms_weights_is_refused_naming_the_file(tmp_path: Path) -> None:
    """No caprl wrote a maxout Show-Tell without its cell; such a file is refused, not guessed at."""
    path = tmp_path / "best.pt"
    written_before_the_cell_option(path, "maxout")
    with pytest.raises(CaprlError) as raised:
        checkpoint.load(path)
    assert str(raised.value) == (
        f"{path}: its model (fc) records no 'cell' option, so it was written before caprl had one, when every fc "
        "was built with cell: lstm; but its weights are not that model's (no 'lstm.weight_ih'): retrain the run "
        "(delete its runs/<dataset>/<run>/ folder)")
