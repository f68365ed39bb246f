"""Paper 003 (Shi et al.; Ren et al. where it is vague): the value network, the embedding reward,
the value pre-training and actor-critic objectives, lookahead inference, its evaluation section
and Table 1 (ac_table1)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.models import checkpoint
from caprl.decoding import DECODERS, beam_search
from caprl.errors import CaprlError
from caprl.decoding.lookahead import lookahead_search
from caprl.models import build_model
from caprl.objectives import Batch, Objective, ObjectiveEnv, build_objective
from caprl.objectives.actor_critic import advantages
from caprl.objectives.discriminative import speaker_samples
from caprl.objectives.value import ValueNetwork, embedding_reward, value_from_checkpoint
from caprl.retrieval import Listener, ListenerConfig
from caprl.tables import ac_numbers as paper
from caprl.tables.actor_critic import ac_table1
from caprl.tables.render import Cell, Table
from conftest import REPO, default_params
from numerics import assert_float64_close, to_float64
from toy import CAPTIONS, CONSTANT_LR, FEAT, WORDS, ToyData, count_red, decode, same, snapshot, toy_trainer
from toy import fit as toy_fit

PAPER_TEXT = REPO.parent / "shared" / "papers" / "003_45a29dab880026f9.txt"
CONFIG = ListenerConfig(word_size=8, hidden_size=12, margin=0.2)
VALUE = {"lr": 1e-2, "epochs": 1, **CONSTANT_LR, "n_samples": 2, "reward": "count_red", "cider_weight": 0.0,
         "value_hidden": 8, "value_mlp": [8, 4]}
AC = {**VALUE, "value_lr": 1e-2}


def make(method: str, options: dict[str, Any] | None = None, seed: int = 0, where: str = "objective",
         exact: bool = False, dropout: float = 0.0, reward: Any = count_red) -> tuple[Any, Objective, Batch]:
    """The method's objective on a tiny fc model, its options the defaults above with ``options``
    on top (``exact``: ``options`` alone), and a toy batch with its noise."""
    torch.manual_seed(seed)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": dropout}, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: reward, max_length=6,
                       extras={"listener": CONFIG, "feat_dim": FEAT, "seed": 0})
    base = VALUE if method == "value" else AC
    objective = build_objective(method, dict(options or {}) if exact else {**base, **(options or {})}, env, model,
                                where=where)
    batch = ToyData().batch([0, 1, 2, 3])
    batch.noise = decoding.Noise(seed=0, step=0, total=4)
    return model, objective, batch


def no_grad(module: torch.nn.Module) -> bool:
    return all(p.grad is None or not bool(p.grad.any()) for p in module.parameters())


# --- the pieces ---------------------------------------------------------------------------------
def test_advantage_and_losses_on_a_hand_worked_example() -> None:
    reward = torch.tensor([1.0, 0.5])
    values = torch.tensor([[0.2, 0.4, 0.9], [0.5, 0.0, 1.0]], requires_grad=True)
    a = advantages(reward, values)
    torch.testing.assert_close(a, torch.tensor([[0.8, 0.6, 0.1], [0.0, 0.5, -0.5]]))
    assert not a.requires_grad  # a constant for the policy
    _, objective, _ = make("actor_critic")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # caption 0 ended at its 2nd word
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -1.0, -3.0]])
    policy = -objective.mean(a * logp, mask)  # -(-0.8 - 1.2 + 0 - 0.5 + 1.5) / 5 = 0.2
    assert float(policy) == pytest.approx(0.2)
    mse = objective.value_mse(values, reward, mask)  # (0.64 + 0.36 + 0 + 0.25 + 0.25) / 5 = 0.3
    assert float(mse.detach()) == pytest.approx(0.3)


@pytest.mark.numerics
def test_embedding_reward_is_the_cosine_of_caption_and_image_embeddings() -> None:
    torch.manual_seed(0)
    listener = Listener(CONFIG, len(WORDS), FEAT)
    tokens = torch.tensor([[1, 2, 3, 0, 0], [1, 4, 5, 3, 0], [2, 0, 0, 0, 0]])
    # three computations of a cosine (other kernels, other summation orders): compared in float64
    listener, pooled = to_float64(listener, torch.randn(3, FEAT))
    got = embedding_reward(listener, tokens, pooled)
    assert_float64_close(got, listener.similarity(tokens, pooled).diagonal())
    out, _ = listener.gru(F.embedding(tokens, listener.words))  # by hand: GRU output at each last word
    raw = out[torch.arange(3), torch.tensor([2, 3, 0])]
    assert_float64_close(got, F.cosine_similarity(raw, listener.image(pooled), dim=-1))
    assert not got.requires_grad


@pytest.mark.numerics
def test_value_network_values_equal_its_stepping_api() -> None:
    torch.manual_seed(0)
    value = ValueNetwork(len(WORDS), FEAT, 8, [8, 4])
    pooled, tokens = torch.randn(4, FEAT), torch.randint(0, len(WORDS), (4, 6))
    # the MLP over all [N, T+1] states at once against one column at a time (other matmul shapes): in float64
    value, pooled = to_float64(value, pooled)
    whole = value.values(pooled, tokens)
    assert whole.shape == (4, 7)
    state, columns = value.start(pooled), []
    columns.append(value.value(state))
    for t in range(tokens.shape[1]):
        state = value.step(state, tokens[:, t])
        columns.append(value.value(state))
    assert_float64_close(whole, torch.stack(columns, dim=1))
    assert not any(p is q for p in value.parameters() for q in build_model(
        "fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, len(WORDS), FEAT, 3).parameters())


# --- the objectives ----------------------------------------------------------------------------
def test_value_loss_never_moves_the_policy_and_policy_loss_never_the_value_network() -> None:
    model, objective, batch = make("actor_critic")
    objective.train()
    model.train()
    policy, value, stats = objective.parts(model, batch)
    assert {"policy_loss", "value_mse", "reward_sample", "advantage"} <= set(stats)
    policy.backward(retain_graph=True)
    assert not no_grad(model) and no_grad(objective.value) and no_grad(objective.listener)
    model.zero_grad(set_to_none=True)
    value.backward()
    assert no_grad(model) and not no_grad(objective.value) and no_grad(objective.listener)
    groups = objective.param_groups(model)
    assert [(g["name"], g["lr"]) for g in groups] == [("model", 1e-2), ("value", 1e-2)]
    assert objective.captioner and objective.select == "CIDEr-D" and not objective.retrieval


@pytest.mark.numerics
def test_actor_critic_reward_mixes_cider_with_the_embedding() -> None:
    _, objective, batch = make("actor_critic", {"cider_weight": 0.25})
    tokens = torch.tensor([[1, 2, 3, 0], [1, 2, 2, 0], [1, 4, 5, 0], [4, 0, 0, 0]])
    got = objective.rewards([0, 1, 2, 3], tokens, batch.pooled)
    emb = embedding_reward(objective.listener, tokens, batch.pooled)
    # bit-identical: the same embedding_reward call on the same rows, then the same elementwise ops
    assert torch.equal(got, 0.75 * emb + 0.25 * torch.tensor([1.0, 2.0, 0.0, 0.0]))


def fit(objective: Objective, model: Any, state_dir: Path, epochs: int = 2) -> list[dict[str, Any]]:
    """The real trainer on the toy data (8 images a batch)."""
    return toy_fit(toy_trainer(objective, model, state_dir, epochs))


def test_value_pretraining_trains_the_value_network_only_then_actor_critic_starts_from_it(tmp_path: Path) -> None:
    from caprl.training.run import load_inits

    model, objective, _ = make("value")
    policy, listener, value = snapshot(model), snapshot(objective.listener), snapshot(objective.value)
    history = fit(objective, model, tmp_path / "value")
    assert same(model, policy) and same(objective.listener, listener) and not same(objective.value, value)
    assert {"val_value_mse", "val_neg_value_mse"} <= set(history[-1])
    assert history[-1]["val_value_mse"] > 0 and history[-1]["val_neg_value_mse"] == -history[-1]["val_value_mse"]
    best = checkpoint.load(tmp_path / "value" / "best.pt")
    assert best.position["select"] == "neg_value_mse" and set(best.modules) == {"model", "listener", "value"}
    rebuilt = value_from_checkpoint(best)
    assert rebuilt is not None and same(rebuilt, best.modules["value"].state)

    speaker, ac, _ = make("actor_critic", seed=1)
    path = str(tmp_path / "value" / "best.pt")
    load_inits({"model": speaker, **ac.modules_to_save()}, {"model": path, "listener": path, "value": path},
               {"model": "x", "listener": "x", "value": "x"}, "ac", "toy")
    assert same(ac.value, best.modules["value"].state)
    _, small, _ = make("actor_critic", {"value_hidden": 6}, where="runs.fc-actor_critic")
    with pytest.raises(CaprlError, match=r"runs\.fc-actor_critic: .*value_hidden 6.*value_hidden 8"):
        small.value.load_state_dict(best.modules["value"].state)


class Said:
    """A language reward that keeps the captions it scores (so a test sees what an objective sampled)."""

    def __init__(self) -> None:
        self.captions: list[list[str]] = []

    def __call__(self, image_ids: Any, captions: Any) -> np.ndarray:
        self.captions.append([" ".join(c) for c in captions])
        return np.zeros(len(captions))


def test_value_pretraining_samples_the_captions_actor_critic_samples_in_train_mode() -> None:
    """The value network is fitted on the states actor-critic uses it on: the frozen policy's
    captions sampled in train mode (dropout on) with the trainer's noise, the very captions
    actor-critic samples from the same weights, noise and RNG state; not the eval-mode ones."""
    said = Said()
    options = {"cider_weight": 0.5, "n_samples": 3}  # the mixed reward reads (and keeps) every caption
    model, pretraining, _ = make("value", options, dropout=0.5, reward=said)
    actor_critic = build_objective("actor_critic", {**AC, **options}, pretraining.env, model)
    batch = ToyData().batch(list(range(16)))
    for objective in (pretraining, actor_critic):
        model.train()  # as the trainer does before every step
        objective.train()
        batch.noise = decoding.Noise(seed=0, step=3, total=16)  # the trainer's noise of step 3
        torch.manual_seed(11)  # the dropout masks
        objective.loss(model, batch)
    fitted_on, used_on = said.captions
    batch.noise = decoding.Noise(seed=0, step=3, total=16)
    torch.manual_seed(11)
    eval_mode = decode(speaker_samples(model, batch, 3, 6).last_stage())
    assert fitted_on == used_on
    assert [" ".join(c) for c in eval_mode] != used_on  # dropout changes the captions: the modes differ here
    assert model.training  # the policy's mode is the trainer's


def test_value_validation_is_the_same_every_epoch_and_leaves_the_training_rng_alone() -> None:
    """Validation samples in train mode too, with fixed dropout masks: two calls agree whatever
    the RNG state, and the training's RNG state is untouched."""
    model, pretraining, _ = make("value", dropout=0.5)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = pretraining.validation(model, ToyData())
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    assert pretraining.validation(model, ToyData()) == first


def test_actor_critic_decays_both_rates_by_0_9_every_two_epochs(tmp_path: Path) -> None:
    """Paper 003 sec. 4.1 (params.yaml's actor_critic defaults): the policy's rate and the value
    network's are both x0.9 every two epochs; the history records the policy's."""
    defaults = default_params()["objectives"]["actor_critic"]
    decay = {k: defaults[k] for k in ("lr_decay_every", "lr_decay_rate")}
    assert decay == {"lr_decay_every": 2, "lr_decay_rate": 0.9}
    model, objective, _ = make("actor_critic", {**decay, "lr": 1e-2, "value_lr": 4e-3})
    trainer = toy_trainer(objective, model, tmp_path, epochs=5)
    seen: list[list[float]] = []
    trainer.optimizer.register_step_pre_hook(lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups]))
    history = toy_fit(trainer)
    factors = [0.9 ** (epoch // 2) for epoch in range(5)]  # 1, 1, 0.9, 0.9, 0.81
    assert [h["lr"] for h in history] == [1e-2 * f for f in factors]
    assert seen == [[1e-2 * f, 4e-3 * f] for f in factors for _step in range(2)]  # two steps an epoch


@pytest.mark.parametrize("options, key", [
    ({"value_mlp": [8]}, "value_mlp"), ({"value_mlp": 8}, "value_mlp"), ({"cider_weight": 1.5}, "cider_weight"),
    ({"value_hidden": "big"}, "value_hidden"), ({"value_lr": None}, "value_lr"), ({"gamma": 0.9}, "gamma")])
def test_a_wrong_option_names_the_key(options: dict[str, Any], key: str) -> None:
    values = {k: v for k, v in {**AC, **options}.items() if v is not None}
    with pytest.raises(CaprlError, match=rf"runs\.fc-actor_critic\.options.*{key}"):
        make("actor_critic", values, where="runs.fc-actor_critic", exact=True)


def test_params_value_and_actor_critic_sizes_agree() -> None:
    objectives, runs = default_params()["objectives"], default_params()["runs"]
    assert all(objectives["value"][k] == objectives["actor_critic"][k] for k in ("value_hidden", "value_mlp"))
    assert runs["fc-actor_critic"]["init"] == {"model": "fc-xe", "listener": "listener", "value": "fc-value"}


# --- lookahead inference ---------------------------------------------------------------------------
def lookahead_model(vocab: int = 12) -> tuple[Any, Any, torch.Tensor]:
    """A tiny fc model whose beams have various lengths (seeded; logits sharpened)."""
    torch.manual_seed(1)
    model = build_model("fc", {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}, vocab, FEAT, 3).eval()
    with torch.no_grad():
        model.logit.weight.mul_(4)
        model.logit.bias[0] += 0.3
    pooled = torch.randn(6, FEAT)
    return model, model.encode(pooled, torch.randn(6, 3, FEAT)), pooled


@pytest.mark.numerics
def test_lookahead_with_lam_1_is_beam_search() -> None:  # bit-identical: lam = 1 steps as beam search does, + 0
    model, ctx, pooled = lookahead_model()
    value = ValueNetwork(12, FEAT, 8, [8, 4])
    lengths = set()
    with torch.no_grad():
        for k in (1, 2, 3, 5):
            tokens, scores = beam_search(model, ctx, k, 8)
            got, got_scores = lookahead_search(model, ctx, value, pooled, k, 8, lam=1.0, candidates=3)
            assert torch.equal(got, tokens) and torch.equal(got_scores, scores)
            lengths |= set((tokens[:, 0] > 0).sum(-1).tolist())
        decoded = DECODERS["lookahead"](model, ctx, 8, beam_size=3, value=value, pooled=pooled, lam=1.0)
        assert torch.equal(decoded, DECODERS["beam"](model, ctx, 8, beam_size=3))
    assert len(lengths) > 2  # the beams end at different steps


class Favours:
    """A critic that values 5 the states whose last word is ``word`` (0 otherwise)."""

    def __init__(self, word: int) -> None:
        self.word = word

    def start(self, pooled: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.zeros(pooled.shape[0], dtype=torch.long),)

    def step(self, state: tuple[torch.Tensor], words: torch.Tensor) -> tuple[torch.Tensor]:
        return (words,)

    def value(self, state: tuple[torch.Tensor]) -> torch.Tensor:
        return 5.0 * (state[0] == self.word).float()


def test_lookahead_picks_the_word_the_value_network_favours() -> None:
    model, ctx, pooled = lookahead_model()
    with torch.no_grad():
        plain = beam_search(model, ctx, 3, 8)[0][:, 0]
        word = 7 if int(plain[0, 0]) != 7 else 8
        picked = lookahead_search(model, ctx, Favours(word), pooled, 3, 8, lam=0.4, candidates=12)[0][:, 0]
    assert bool((plain[:, 0] != word).any())
    assert bool((picked == word).any(dim=1).all())  # every image's caption says the favoured word
    with pytest.raises(CaprlError, match="value network"):
        DECODERS["lookahead"](model, ctx, 8, beam_size=3)


# --- evaluation --------------------------------------------------------------------------------
def eval_settings(**lookahead: Any) -> Any:
    from caprl.evaluation.settings import EvalSettings
    from conftest import default_params

    params = default_params()
    params["evaluate"].update(batch_size=3, metrics=["bleu", "cider_d"], n_examples=2)
    params["evaluate"].pop("lookahead")
    params["evaluate"].update({"lookahead": lookahead} if lookahead else {})
    return EvalSettings.from_params(params)


def test_the_evaluation_scores_lookahead_captions_into_their_section() -> None:
    from caprl.evaluation.run import decoded_captions, decoder_settings, lookahead_report

    model, ac, _ = make("actor_critic")
    data, ids = ToyData(), ToyData().split_ids("val")
    references = {i: [" ".join(WORDS[t] for t in CAPTIONS[i % 4] if t), "a shape"] for i in ids}
    settings, decode = eval_settings(lam=0.4, candidates=3), {"beam_size": 2, "max_length": 6}
    report = lookahead_report(model, ac.value, data, ids, references, settings, decode)
    assert {k: report[k] for k in ("lambda", "candidates", "beam_size")} == {"lambda": 0.4, "candidates": 3,
                                                                              "beam_size": 2}
    assert {"BLEU-3", "BLEU-4", "CIDEr-D"} <= set(report["metrics"]) and len(report["examples"]) == 2
    direct = decoded_captions(model, data, ids, "lookahead", 3, beam_size=2, max_length=6,
                              **decoder_settings(settings, "decode.method", "fc-ac", "lookahead", ac.value))
    assert report["examples"][0]["caption"] == direct[ids[0]]
    with pytest.raises(CaprlError, match=r"runs\.fc-ac2\.decode\.method: .*run fc-ac2 holds none"):
        decoder_settings(settings, "runs.fc-ac2.decode.method", "fc-ac2", "lookahead", None)
    with pytest.raises(CaprlError, match=r"^decode\.method: .*fc-ac.*evaluate\.lookahead"):
        decoder_settings(eval_settings(), "decode.method", "fc-ac", "lookahead", ac.value)
    assert decoder_settings(settings, "decode.method", "fc-ac", "beam", None) == {}
    from caprl.objectives import run_checks  # the key a caller names: the run's own decode.method, else the global

    runs = {"runs": {"fc-ac": {"method": "actor_critic", "model": "fc"},
                     "fc-ac2": {"method": "actor_critic", "model": "fc", "decode": {"method": "lookahead"}}}}
    assert [run_checks.decode_key(runs, r) for r in ("fc-ac", "fc-ac2")] == ["decode.method",
                                                                           "runs.fc-ac2.decode.method"]


# --- Table 1 ---------------------------------------------------------------------------------------
def table_params() -> dict[str, Any]:
    params = default_params()
    params["datasets"]["coco"]["enabled"] = True
    for spec in params["datasets"].values():
        spec.pop("runs", None)
    return params


def score(run: str, dataset: str, metrics: dict[str, float],
          lookahead: dict[str, float] | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {"run": run, "dataset": dataset, "metrics": metrics, "unavailable": {}}
    if lookahead is not None:
        report["lookahead"] = {"lambda": 0.4, "candidates": 10, "beam_size": 5, "metrics": lookahead,
                               "unavailable": {"SPICE": "java not found on PATH"}}
    return report


def metrics(b3: float, b4: float, m: float, c: float) -> dict[str, float]:
    return {"BLEU-3": b3, "BLEU-4": b4, "METEOR": m, "CIDEr-D": c, "BLEU-1": 0.9}


def hand_scores(dataset: str) -> dict[str, Any]:
    return {"fc-xe": score("fc-xe", dataset, metrics(0.30, 0.20, 0.21, 0.80)),
            "fc-actor_critic": score("fc-actor_critic", dataset, metrics(0.33, 0.23, 0.22, 0.85),
                                     lookahead=metrics(0.35, 0.25, 0.23, 0.90)),
            "fc-scst": score("fc-scst", dataset, metrics(0.36, 0.26, 0.24, 0.95))}


def rows(table: Table) -> dict[str, list[Cell]]:
    return dict(table.rows)


def test_ac_table1_rows_by_method_and_model_with_the_papers_on_coco_only() -> None:
    params = table_params()
    table = ac_table1(params, "coco", hand_scores("coco"))
    labels = [label for label, _ in table.rows]
    assert labels == [f"{label} [paper]" for label, _ in paper.TABLE1_PRIOR] + [
        "XE", "Actor-critic (beam 5)", "Actor-critic (lookahead, beam 5, λ = 0.4)", "SCST"]
    cells = rows(table)
    assert [c.text() for c in cells["m-RNN [11] [paper]"]] == ["— (paper 35.0)", "— (paper 25.0)", "—", "—"]
    assert [c.ours for c in cells["XE"]] == pytest.approx([30.0, 20.0, 21.0, 80.0])
    assert [c.ours for c in cells["Actor-critic (beam 5)"]] == pytest.approx([33.0, 23.0, 22.0, 85.0])
    assert [c.ours for c in cells["SCST"]] == pytest.approx([36.0, 26.0, 24.0, 95.0])
    look = cells["Actor-critic (lookahead, beam 5, λ = 0.4)"]
    assert [c.text() for c in look] == ["35.0 (paper 39.5, -4.5)", "25.0 (paper 28.2, -3.2)",
                                        "23.0 (paper 24.3, -1.3)", "90.0 (paper 90.7, -0.7)"]
    assert all(c.paper is None for c in cells["XE"] + cells["SCST"] + cells["Actor-critic (beam 5)"])
    assert any("SPICE: not computed" in n for n in table.notes)

    other = ac_table1(params, "synthetic", hand_scores("synthetic"))
    assert [label for label, _ in other.rows] == labels[len(paper.TABLE1_PRIOR):]
    assert all(c.paper is None for _, cs in other.rows for c in cs)
    assert any("No paper numbers on synthetic" in n for n in other.notes)


def test_ac_table1_finds_runs_by_method_not_by_name_and_shows_missing_sections() -> None:
    params = table_params()
    params["runs"] = {"base": {"method": "xe", "model": "fc"}, "critic": {"method": "actor_critic", "model": "fc"},
                      "other-xe": {"method": "xe", "model": "topdown"}}
    scores = {"base": score("base", "coco", metrics(0.1, 0.1, 0.1, 0.1)),
              "critic": score("critic", "coco", metrics(0.2, 0.2, 0.2, 0.2))}
    table = ac_table1(params, "synthetic", scores)
    cells = rows(table)
    assert [c.ours for c in cells["XE"]] == pytest.approx([10.0] * 4)
    assert all(c.ours is None for c in cells["Actor-critic (lookahead, beam 5, λ = 0.4)"] + cells["SCST"])
    assert any("critic: its score file has no lookahead section" in n for n in table.notes)
    params["runs"].pop("critic")
    assert any("No actor_critic run" in n for n in ac_table1(params, "synthetic", scores).notes)


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason="the paper's text is not beside the repository")
def test_numbers_as_printed_in_the_paper() -> None:
    """Every typed row against Table 1 of the paper's text: a label line, then its four cells."""
    text = PAPER_TEXT.read_text()
    region = re.search(r"^CIDEr\n(.*?)^Since our framework", text, re.S | re.M)
    assert region
    lines = [line.strip() for line in region.group(1).splitlines() if line.strip()]
    printed = [(lines[i], [None if v == "-" else float(v) for v in lines[i + 1 : i + 5]])
               for i in range(0, len(lines), 5)]
    typed = [(label, [row.get(k) for k in paper.KEYS.split()]) for label, row in
             [*paper.TABLE1_PRIOR, ("Ours", paper.TABLE1_OURS)]]
    assert [(label.replace(" ", ""), values) for label, values in typed] == printed
