"""The self-critical greedy baseline's decode mode (option ``greedy_mode``, caprl.objectives.base.GREEDY_MODES):
``eval`` (SCP's loss_wrapper.py) is exactly an eval-mode greedy decode of the images, encoder included
(the former decode was not, for an encoder with dropout: the transformer's);
``train`` (the authors' code of papers 000 and 004) a train-mode one with fresh dropout masks drawn after
the samples'; ``shared`` (the default in code) is caprl's former decode, bit for bit. The samples, and
the random numbers they draw, are the same in every mode; the model is left in train mode."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from caprl import decoding
from caprl.models import build_model
from caprl.objectives import OBJECTIVES, Batch, ObjectiveEnv, build_objective
from caprl.objectives.base import GREEDY_MODES
from conftest import default_params
from toy import CONSTANT_LR, FEAT, WORDS, count_red, decode
import listener_toy

L = 6  # max_length
N = 3  # samples per image
SCST = {"lr": 1e-3, "epochs": 1, **CONSTANT_LR, "n_samples": N, "reward": "count_red", "temperature": 1.0,
        "entropy": 0.0}
SIZES: dict[str, dict[str, Any]] = {
    "fc": {"embed_size": 8, "hidden_size": 16},
    "topdown": {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8},
    "stackcap": {"embed_size": 8, "hidden_size": 16, "att_hidden_size": 8},
    "transformer": {"num_layers": 2, "d_model": 16, "heads": 2, "d_ff": 32, "max_positions": 17, "feat_dropout": 0.5},
}
#: the methods whose baseline may read greedy captions, and their greedy_mode in params.yaml with its source
PAPER_MODES = {"scst": "eval", "sll": "eval", "sll_sle": "eval", "c2f": "train", "luo2018": "train",
               "reinforce_joint": "train", "st_gumbel": "train", "st_multinomial": "train", "psst_gumbel": "train",
               "psst_multinomial": "train"}


def setup(arch: str, n_images: int = 8) -> tuple[Any, Batch, ObjectiveEnv]:
    torch.manual_seed(0)
    model = build_model(arch, {**SIZES[arch], "dropout": 0.5}, len(WORDS), FEAT, 4)
    gen = torch.Generator().manual_seed(1)
    batch = Batch(image_ids=list(range(n_images)), pooled=torch.randn(n_images, FEAT, generator=gen),
                  regions=torch.randn(n_images, 4, FEAT, generator=gen),
                  labels=torch.tensor([[1, 2, 3, 0]] * n_images), label_image=torch.arange(n_images))
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: count_red, max_length=L)
    return model.train(), batch, env


def scst(model: Any, env: ObjectiveEnv, mode: str | None, method: str = "scst") -> Any:
    options = {**SCST, **({} if mode is None else {"greedy_mode": mode})}
    if method == "c2f":
        options = {k: v for k, v in options.items() if k != "entropy"}
    return build_objective(method, options, env, model)


def eval_greedy(model: Any, batch: Batch) -> decoding.Samples:
    """``model.eval()``'s greedy captions: encoded and decoded without dropout."""
    model.eval()
    with torch.no_grad():
        out = decoding.sample(model, model.encode(batch.pooled, batch.regions), L, greedy=True)
    model.train()
    return out


def former(model: Any, batch: Batch, seed: int) -> tuple[decoding.Samples, decoding.Samples]:
    """caprl's former greedy_and_samples, written out: ONE train-mode encoding, the greedy captions
    decoded from it in eval mode, the samples from it in train mode."""
    torch.manual_seed(seed)
    ctx = model.encode(batch.pooled, batch.regions)
    model.eval()
    with torch.no_grad():
        best = decoding.sample(model, ctx, L, greedy=True)
    model.train()
    return best, decoding.sample(model, ctx, L, n=N)


@pytest.mark.parametrize("arch", ["fc", "topdown", "transformer", "stackcap"])
def test_the_eval_baseline_is_the_eval_mode_greedy_decode(arch: str) -> None:
    model, batch, env = setup(arch)
    torch.manual_seed(3)
    best, _ = scst(model, env, "eval", "c2f" if arch == "stackcap" else "scst").greedy_and_samples(model, batch, N)
    assert model.training and all(m.training for m in model.modules())
    assert best is not None and torch.equal(best.tokens, eval_greedy(model, batch).tokens)  # every stage


def test_the_former_decode_differs_from_the_eval_mode_one_where_the_encoder_has_dropout() -> None:
    """What makes the test above fail on caprl's former code: the transformer's encoder has dropout
    (feat_dropout, SCP's): at 0.5 the baseline decoded from the samples' train-mode encoding is another
    caption for some image."""
    model, batch, env = setup("transformer")
    best, _ = former(model, batch, seed=3)
    assert not torch.equal(best.tokens, eval_greedy(model, batch).tokens)


@pytest.mark.parametrize("arch", ["fc", "topdown", "stackcap"])
def test_the_former_decode_was_the_eval_one_where_the_encoder_has_no_dropout(arch: str) -> None:
    """caprl's fc, topdown and Stack-Cap encoders have no dropout (their decoders do): for them the
    former decode (eval-mode decoder) already was the eval-mode greedy caption, bit for bit."""
    model, batch, env = setup(arch)
    best, _ = former(model, batch, seed=3)
    assert torch.equal(best.tokens, eval_greedy(model, batch).tokens)


@pytest.mark.parametrize("mode", ["shared", None])
def test_shared_and_the_default_reproduce_the_former_decode(mode: str | None) -> None:
    for arch in ("fc", "transformer"):
        model, batch, env = setup(arch)
        want_best, want_samples = former(model, batch, seed=5)
        torch.manual_seed(5)
        best, samples = scst(model, env, mode).greedy_and_samples(model, batch, N)
        assert best is not None and torch.equal(best.tokens, want_best.tokens)
        assert torch.equal(samples.tokens, want_samples.tokens)
        assert torch.equal(samples.logprobs, want_samples.logprobs)


def test_the_train_baseline_is_a_train_mode_decode_after_the_samples() -> None:
    model, batch, env = setup("topdown")
    torch.manual_seed(7)
    best, samples = scst(model, env, "train").greedy_and_samples(model, batch, N)
    torch.manual_seed(7)
    want_samples = decoding.sample(model, model.encode(batch.pooled, batch.regions), L, n=N)
    with torch.no_grad():  # fresh dropout masks, drawn after the samples'
        want = decoding.sample(model, model.encode(batch.pooled, batch.regions), L, greedy=True)
    assert model.training
    assert best is not None and torch.equal(best.tokens, want.tokens)
    assert torch.equal(samples.tokens, want_samples.tokens)
    assert not torch.equal(best.tokens, eval_greedy(model, batch).tokens)  # dropout 0.5 moved some caption


def test_every_mode_draws_the_same_samples_and_only_train_draws_more() -> None:
    """The samples (and their dropout masks) do not depend on the mode; eval's extra encode draws no
    random numbers (no dropout in eval mode), so eval and shared leave the RNG where the samples did."""
    model, batch, env = setup("topdown")
    drawn = {}
    for mode in GREEDY_MODES:
        torch.manual_seed(9)
        best, samples = scst(model, env, mode).greedy_and_samples(model, batch, N)
        drawn[mode] = (samples, torch.get_rng_state())
    torch.manual_seed(9)
    decoding.sample(model, model.encode(batch.pooled, batch.regions), L, n=N)
    after_samples = torch.get_rng_state()
    for mode, (samples, rng) in drawn.items():
        assert torch.equal(samples.tokens, drawn["eval"][0].tokens)
        assert torch.equal(samples.logprobs, drawn["eval"][0].logprobs)
        assert torch.equal(rng, after_samples) == (mode != "train"), mode


def test_a_baseline_without_greedy_captions_decodes_none() -> None:
    model, batch, env = setup("fc")
    best, _ = scst(model, env, "eval").greedy_and_samples(model, batch, N, greedy=False)
    assert best is None and model.training


@pytest.mark.parametrize("method", ["st_gumbel", "psst_multinomial"])
def test_the_straight_through_methods_read_the_same_baseline(method: str) -> None:
    _, objective, batch = listener_toy.make(method, {"greedy_mode": "eval"})
    model, _, _ = setup("fc")  # the toy speaker has no dropout: this one has 0.5
    greedy, _, _ = objective.decode(model, batch)
    assert model.training
    assert greedy is not None and torch.equal(greedy.tokens, eval_greedy(model, batch).tokens)


def test_params_yaml_sets_each_methods_greedy_mode_from_its_source() -> None:
    taking = {name for name, cls in OBJECTIVES.items() if "greedy_mode" in cls.Options.__dataclass_fields__}
    assert taking == set(PAPER_MODES)
    objectives = default_params()["objectives"]
    assert {m: objectives[m]["greedy_mode"] for m in PAPER_MODES} == PAPER_MODES
    assert set(GREEDY_MODES) == {"eval", "train", "shared"}


def test_an_unknown_greedy_mode_is_an_error_naming_the_key() -> None:
    model, _, env = setup("fc")
    with pytest.raises(Exception, match="greedy_mode"):
        build_objective("scst", {**SCST, "greedy_mode": "dropout"}, env, model, where="runs.x")
