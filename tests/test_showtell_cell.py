"""Show-Tell's recurrence: the paper's LSTM (default) or self-critical.pytorch's maxout LSTMCore."""

from __future__ import annotations

import pytest
import torch

from caprl.errors import CaprlError
from caprl.models import build_model, timeshared
from caprl.models.fc import MaxoutLSTMCell

SIZES = {"embed_size": 6, "hidden_size": 10, "dropout": 0.0}


def test_maxout_cell_is_scps_lstm_core_by_hand() -> None:
    """SCP's LSTMCore: all = i2h(x) + h2h(h); i, f, o = sigmoid of the first three chunks;
    c' = f c + i max(chunk 4, chunk 5); h' = o tanh(c')."""
    torch.manual_seed(0)
    cell = MaxoutLSTMCell(6, 10)
    x, h, c = torch.randn(4, 6), torch.randn(4, 10), torch.randn(4, 10)
    with torch.no_grad():
        h2, c2 = cell(x, (h, c))
        pre = x @ cell.i2h.weight.T + cell.i2h.bias + h @ cell.h2h.weight.T + cell.h2h.bias
        gates = torch.sigmoid(pre[:, :30])
        i, f, o = gates[:, :10], gates[:, 10:20], gates[:, 20:30]
        want_c = f * c + i * torch.max(pre[:, 30:40], pre[:, 40:50])
    torch.testing.assert_close(c2, want_c)
    torch.testing.assert_close(h2, o * torch.tanh(want_c))


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
    """The cause of the SCST gap against self-critical.pytorch's trainer (benchmarks/README.md):
    caprl's Show-Tell had a tanh LSTM where Rennie et al.'s FC model and SCP have the maxout
    input transform. params.yaml's fc (and every recipe's) must build that cell."""
    import yaml

    from conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    sizes = {k: v for k, v in params["models"]["fc"].items() if k != "arch"}
    assert type(build_model("fc", sizes, 12, 5, 4).lstm) is MaxoutLSTMCell
    for recipe in sorted((REPO / "configs" / "recipes").glob("*.yaml")):
        fc = (yaml.safe_load(recipe.read_text()).get("models") or {}).get("fc")
        if fc:
            assert fc.get("cell", sizes["cell"]) == "maxout", recipe.name
