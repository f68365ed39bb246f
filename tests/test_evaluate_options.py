"""``caprl evaluate`` (and ``caprl caption``) refuse the decoding options their decoder would
ignore, in the words of the plan (``snakemake -n``): one rule,
:func:`caprl.decoding.options.options_problem`.

Decoders are handed only the options they read, so before this check an evaluation with, say,
``top_p`` under beam search scored plain beam-search captions under a label that said otherwise.
The stages run as the workflow runs them (subprocesses) on the TINY synthetic set made by the
real stages, with a real (degenerate) checkpoint of run fc-xe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from caprl import params as params_mod
from caprl.errors import CaprlError
from caprl.decoding.options import run_options_problem
from caprl.workflow import plan as wp
from conftest import default_params
from pipeline_data import DatasetPaths
from stage_inputs import caprl, degenerate_checkpoint, user_error
from stage_inputs import write_params as params_file

#: (the run's own decode:, the global decode: edits, the words of the refusal)
IGNORED: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({"top_p": 0.9}, {"method": "beam"},
     "runs.fc-xe.decode.top_p: 0.9, but the beam decoder (runs.fc-xe.decode.method) does not read it (set it back "
     "to 1.0; decoders that read it: sample)"),
    ({"method": "beam", "temperature": 0.7}, {},
     "runs.fc-xe.decode.temperature: 0.7, but the beam decoder (runs.fc-xe.decode.method) does not read it"),
    ({}, {"method": "greedy", "groups": 2, "diversity_lambda": 0.5},
     "run fc-xe: decode.groups: 2, but the greedy decoder (decode.method) does not read it (set it back to 1; "
     "decoders that read it: beam, top_k_beams)"),
    ({}, {"method": "sample", "length_penalty": "wu", "length_alpha": 0.6},
     "run fc-xe: decode.length_penalty: 'wu', but the sample decoder (decode.method) does not read it"),
    ({}, {"method": "lookahead", "top_k": 5}, "run fc-xe: decode.top_k: 5, but the lookahead decoder"),
]


def with_decode(params: dict[str, Any], own: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    params["decode"].update(edits)
    if own:
        params["runs"]["fc-xe"]["decode"] = own
    return params


@pytest.mark.parametrize("own, edits, words", IGNORED)
def test_the_plan_and_evaluate_ask_one_rule(write_params: Any, own: dict[str, Any], edits: dict[str, Any],
                                            words: str) -> None:
    """The problem ``caprl evaluate`` raises is the plan's, with the run named where its key does not."""
    params = params_mod.load(write_params(with_decode(default_params(), own, edits)))
    decode = params_mod.run_spec(params, "fc-xe").decode
    problem = run_options_problem(params, "fc-xe", decode)
    assert problem is not None and problem.startswith(words), problem
    with pytest.raises(CaprlError) as planned:
        wp.build_plan(params)
    if own:  # only fc-xe's decoding is wrong: the plan stops at it, in the same words
        assert str(planned.value) == problem
    else:  # every run's is: the plan stops at the first, the same words but the run's name
        assert problem == f"run fc-xe: {planned.value}"


def test_options_the_decoder_reads_pass(write_params: Any) -> None:
    for own in ({"top_p": 0.9, "method": "sample"}, {"groups": 2, "diversity_lambda": 0.5, "beam_size": 4},
                {"block_trigrams": True, "method": "greedy"}):
        params = params_mod.load(write_params(with_decode(default_params(), own, {})))
        assert run_options_problem(params, "fc-xe", params_mod.run_spec(params, "fc-xe").decode) is None


@pytest.fixture(scope="module")
def dataset(research_dataset: DatasetPaths) -> DatasetPaths:
    return research_dataset


def evaluate(dataset: DatasetPaths, params: Path, ckpt: Path, out: Path) -> Any:
    return caprl("evaluate", params, "--dataset", "synthetic", "--run", "fc-xe", "--checkpoint", ckpt,
                 "--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels", dataset.labels,
                 "--features", dataset.features, "--refs", dataset.references["test"],
                 "--out-captions", out / "captions.json", "--out-scores", out / "scores.json",
                 "--out-examples", out / "examples.json", cwd=dataset.workdir)


@pytest.mark.parametrize("case", [0, 2])  # the run's own decode:, and the global one
def test_evaluate_refuses_an_option_its_decoder_would_ignore(dataset: DatasetPaths, case: int) -> None:
    own, edits, words = IGNORED[case]
    out = dataset.workdir / f"ignored-options-{case}"
    params = with_decode(yaml.safe_load(dataset.params.read_text()), own, edits)
    ckpt = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", out / "fc-xe.pt")
    err = user_error(evaluate(dataset, params_file(out, params), ckpt, out), "evaluate")
    assert err.startswith(f"caprl evaluate: error: {words}"), err
    assert sorted(p.name for p in out.iterdir()) == ["fc-xe.pt", "params.yaml"]  # nothing written


def test_caption_refuses_an_option_its_decoder_would_ignore(dataset: DatasetPaths) -> None:
    out = dataset.workdir / "ignored-options-caption"
    ckpt = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", out / "fc-xe.pt")
    proc = caprl("caption", dataset.params, "--checkpoint", ckpt, "--features", dataset.features,
                 "--images", dataset.workdir / "data", "--method", "greedy", "--decode", "top_k=5",
                 "--out", out / "c.json", cwd=dataset.workdir)
    err = user_error(proc, "caption")
    assert err.startswith("caprl caption: error: decode.top_k: 5, but the greedy decoder (decode.method) does not "
                          "read it (set it back to 0; decoders that read it: sample) [decode settings of run fc-xe: "
                          "its decode: with --method, --beam-size and --decode on top]"), err
    assert sorted(p.name for p in out.iterdir()) == ["fc-xe.pt"]
