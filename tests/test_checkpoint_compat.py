"""A run starts from another run's checkpoint only where the weights are its model's (issue 55):
another architecture, or the same one at other sizes, is refused naming the run, the file and what
differs (caprl.models.checkpoint.load_weights), never with torch's ``size mismatch``. Each test
loads a real checkpoint file through the trainer's loader (caprl.training.run.load_inits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from caprl.errors import CaprlError
from caprl.models import build_model, checkpoint
from caprl.training.run import load_inits

VOCAB, FEAT, REGIONS = 12, 5, 4
SHA = "s" * 64
FC = {"embed_size": 6, "hidden_size": 10, "dropout": 0.0, "cell": "maxout"}
TOPDOWN = {"embed_size": 6, "hidden_size": 10, "att_hidden_size": 8, "dropout": 0.0}
TRANSFORMER = {"num_layers": 1, "d_model": 16, "heads": 2, "d_ff": 32}


def written(path: Path, run: str, arch: str, options: dict[str, Any]) -> torch.nn.Module:
    """A real best.pt of run ``run``'s caption model (``arch`` with ``options``), as training writes it."""
    torch.manual_seed(0)
    model = build_model(arch, options, VOCAB, FEAT, REGIONS)
    checkpoint.save(path, checkpoint.Checkpoint(run={"name": run, "method": "xe", "model": arch, "init": {}},
                                                modules={checkpoint.MODEL: checkpoint.model_record(model, arch)},
                                                vocab_sha256=SHA))
    return model


def test_a_transformers_weights_do_not_start_a_top_down_run(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    written(path, "transformer-xe", "transformer", TRANSFORMER)
    topdown = build_model("topdown", TOPDOWN, VOCAB, FEAT, REGIONS)
    before = {k: v.clone() for k, v in topdown.state_dict().items()}
    with pytest.raises(CaprlError) as raised:
        load_inits({"model": topdown}, {"model": str(path)}, {"model": "transformer-xe"}, "topdown-scst", SHA)
    assert str(raised.value) == (
        f"{path}: runs.topdown-scst.init.model: run transformer-xe trains a transformer caption model and run "
        "topdown-scst a topdown: the weights of one architecture cannot start another; start run topdown-scst "
        "from a run of a topdown model (e.g. its xe run), or drop init.model to train it from scratch")
    assert all(torch.equal(v, before[k]) for k, v in topdown.state_dict().items())  # nothing half-loaded


def test_the_loader_names_the_run_that_wrote_the_file_not_the_one_params_expect(tmp_path: Path) -> None:
    """``--init model=`` a file of another run than ``runs.<run>.init.model``: the file's own run is named."""
    path = tmp_path / "other.pt"
    written(path, "transformer-xe", "transformer", TRANSFORMER)
    fc = build_model("fc", FC, VOCAB, FEAT, REGIONS)
    with pytest.raises(CaprlError, match=rf"^{path}: runs\.fc-scst\.init\.model: run transformer-xe trains a "
                                         r"transformer caption model and run fc-scst a fc: "):
        load_inits({"model": fc}, {"model": str(path)}, {"model": "fc-xe"}, "fc-scst", SHA)


@pytest.mark.parametrize("options, says", [
    ({**FC, "hidden_size": 12}, "hidden_size 10 there, 12 here; lstm.i2h.weight [50, 6] there, [60, 6] here"),
    ({**FC, "cell": "lstm"}, "cell 'maxout' there, 'lstm' here; no weight lstm.weight_ih, lstm.weight_hh, "
                             "lstm.bias_ih ...; unknown weight lstm.i2h.weight, lstm.i2h.bias, lstm.h2h.weight ..."),
])
def test_the_same_architecture_at_other_sizes_is_refused_naming_what_differs(tmp_path: Path, options: dict[str, Any],
                                                                             says: str) -> None:
    path = tmp_path / "best.pt"
    written(path, "fc-xe", "fc", FC)
    model = build_model("fc", options, VOCAB, FEAT, REGIONS)
    with pytest.raises(CaprlError) as raised:
        load_inits({"model": model}, {"model": str(path)}, {"model": "fc-xe"}, "fc-scst", SHA)
    message = str(raised.value)
    assert message.startswith(f"{path}: runs.fc-scst.init.model: the fc model of run fc-xe does not fit run "
                              "fc-scst's (")
    assert says in message and "size mismatch" not in message
    assert message.endswith("give run fc-scst's model the options of run fc-xe's, or drop init.model to train it "
                            "from scratch")


def test_weights_of_the_runs_own_architecture_and_sizes_load(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    trained = written(path, "fc-xe", "fc", {**FC, "dropout": 0.3})  # dropout holds no weight: it may differ
    model = build_model("fc", FC, VOCAB, FEAT, REGIONS)
    load_inits({"model": model}, {"model": str(path)}, {"model": "fc-xe"}, "fc-scst", SHA)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in model.state_dict().items())
