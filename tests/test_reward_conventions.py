"""Each paper's reward text and model, as its authors' code has them (issue 55).

* ``eos: true`` (self-critical.pytorch's ``array_to_str`` over ``data['gts']``): the reward's
  references are the training labels, clipped to ``vocab.max_length``, rare words UNK, the end
  token after every label shorter than the label arrays, whatever ``decode.max_length`` is.
* ``eos: false`` (paper 002's code): the captions as written, no end token.
* params.yaml: every run's reward follows its paper's convention; papers 000/001 train the plain
  LSTM with the image as first input, paper 002 the LSTM whose state the image initialises.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO

from caprl.data.vocab import Labels, build_vocab, encode_labels, write_labels
from caprl.errors import CaprlError
from caprl.models import build_model, timeshared
from caprl.rewards import RewardReferences, build_configured_reward, build_reward, compute_document_frequencies
from caprl.rewards.cider import END

LABEL_LENGTH = 6
CAPTIONS = {  # image id -> captions; "zebra" and "kite" are seen once: UNK; some run past 6 words
    1: [["a", "red", "circle", "above", "a", "blue", "square", "today"], ["a", "red", "circle"],
        ["the", "red", "circle", "is", "above", "a"]],
    2: [["a", "blue", "square", "below", "a", "red", "circle"], ["a", "blue", "square", "near", "a", "zebra"]],
    3: [["a", "green", "triangle", "and", "a", "kite"], ["a", "green", "triangle", "left", "of", "a", "red", "circle"]],
    4: [["a", "blue", "circle"], ["the", "blue", "circle", "alone"]],
}
CANDIDATES = ([1, 1, 2, 3, 4, 2], [["a", "red", "circle"], ["a", "red", "circle", "above", "a", "blue"],
                                   ["a", "blue", "square", "near", "a", "UNK"], ["a", "green", "triangle", "and", "a"],
                                   ["the", "blue", "circle"], ["a", "blue", "square", "below", "a", "red", "circle", "x"]])


def annotations() -> dict:
    return {"dataset": "toy", "images": [{"id": i, "file": f"{i}.png", "split": "train", "captions": caps,
                                          "raw": [" ".join(c) for c in caps]} for i, caps in CAPTIONS.items()]}


@pytest.fixture
def references(tmp_path: Path) -> RewardReferences:
    """The training split's references as ``caprl train`` builds them: from ``caprl vocab``'s files."""
    ann = annotations()
    vocab = build_vocab(ann, min_count=2, max_length=LABEL_LENGTH)
    write_labels(tmp_path / "labels.h5", encode_labels(ann, vocab), vocab)
    return RewardReferences.from_labels(CAPTIONS, Labels(tmp_path / "labels.h5"), vocab)


def params_with(decode_length: int) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["decode"]["max_length"] = decode_length
    params["spice"] = {"corenlp_dir": None}
    return params


def scp_texts() -> tuple[dict[int, list[list[str]]], dict[int, list[list[str]]]]:
    """What self-critical.pytorch's ``array_to_str`` writes for the labels (clipped to the label
    arrays' width, rare words UNK, the end token 0 where the row has room), and its
    ``prepro_ngrams.py`` corpus (every full caption, rare words UNK, then ``<eos>``)."""
    kept = set(build_vocab(annotations(), min_count=2, max_length=LABEL_LENGTH).idx_to_word)

    def unk(c: list[str]) -> list[str]:
        return [w if w in kept else "UNK" for w in c]

    labels = {i: [unk(c)[:LABEL_LENGTH] + ([END] if len(c) < LABEL_LENGTH else []) for c in caps]
              for i, caps in CAPTIONS.items()}
    corpus = {i: [unk(c) + [END] for c in caps] for i, caps in CAPTIONS.items()}
    return labels, corpus


def test_the_labels_as_references_are_clipped_with_rare_words_unk(references: RewardReferences) -> None:
    assert references.label_length == LABEL_LENGTH
    assert references.captions == CAPTIONS  # paper 002's texts: as written
    assert references.labels[1] == [["a", "red", "circle", "above", "a", "blue"], ["a", "red", "circle"],
                                    ["the", "red", "circle", "UNK", "above", "a"]]
    assert references.labels[2][1] == ["a", "blue", "square", "UNK", "a", "UNK"]  # "near", "zebra": UNK
    labels, corpus = scp_texts()
    assert references.labels == {i: [[w for w in c if w != END] for c in caps] for i, caps in labels.items()}
    assert references.unk_captions == {i: [c[:-1] for c in caps] for i, caps in corpus.items()}  # full length


@pytest.mark.parametrize("decode_length", [LABEL_LENGTH, 8, 20])
def test_scp_reward_references_are_the_clipped_labels_with_their_end(references: RewardReferences,
                                                                     decode_length: int) -> None:
    """``cider_d`` (eos: true) scores against the labels with the end where SCP's zero-padded rows
    have it, over ``prepro_ngrams.py``'s document frequencies, whatever ``decode.max_length`` is;
    a sampled caption gets its end below ``decode.max_length``."""
    ids, cands = CANDIDATES
    reward = build_configured_reward("cider_d", params_with(decode_length), references, None)
    labels, corpus = scp_texts()
    assert reward.inner.refs.ref_len.tolist() == [len(r) for i in reward.inner.refs.image_ids for r in labels[i]]
    ended = [[*c, END] if len(c) < decode_length else c for c in cands]
    expected = build_reward("cider_d", labels, compute_document_frequencies(corpus))(ids, ended)
    np.testing.assert_allclose(reward(ids, cands), expected, rtol=0, atol=1e-12)


def test_scp_references_do_not_depend_on_the_decode_length(references: RewardReferences) -> None:
    ids, cands = CANDIDATES
    short = [c for c in cands if len(c) < LABEL_LENGTH]  # ended under every decode length below
    short_ids = [i for i, c in zip(ids, cands) if len(c) < LABEL_LENGTH]
    scores = [build_configured_reward("cider_d", params_with(n), references, None)(short_ids, short)
              for n in (LABEL_LENGTH, 16, 20)]
    np.testing.assert_array_equal(scores[0], scores[1])
    np.testing.assert_array_equal(scores[0], scores[2])


def test_paper_002s_reward_reads_the_captions_as_written(references: RewardReferences) -> None:
    """``cider_d_noeos`` (caption_competition's ``eval_cider_in_rollout``): the full captions, no
    UNK, no end token, the document frequencies given (``caprl cider-df``'s)."""
    ids, cands = CANDIDATES
    df = compute_document_frequencies(CAPTIONS)
    got = build_configured_reward("cider_d_noeos", params_with(20), references, df)(ids, cands)
    np.testing.assert_allclose(got, build_reward("cider_d", CAPTIONS, df)(ids, cands), rtol=0, atol=1e-12)


def test_every_component_of_a_mix_reads_the_same_text(references: RewardReferences) -> None:
    """A mix with ``eos`` scores each in-process component (CIDEr-D, BLEU, ROUGE-L) on SCP's text."""
    params = params_with(20)
    params["rewards"]["m"] = {"kind": "mix", "weights": {"cider_d": 1.0, "bleu4": 0.5, "rouge_l": 2.0}, "eos": True}
    ids, cands = CANDIDATES
    labels, corpus = scp_texts()
    ended = [[*c, END] for c in cands]
    df = compute_document_frequencies(corpus)
    expected = (build_reward("cider_d", labels, df)(ids, ended) + 0.5 * build_reward("bleu4", labels, df)(ids, ended)
                + 2.0 * build_reward("rouge_l", labels)(ids, ended))
    np.testing.assert_allclose(build_configured_reward("m", params, references, None)(ids, cands), expected,
                               rtol=0, atol=1e-12)


# ---------------------------------------------------------------- params.yaml: each paper's convention

PAPER_002_METHODS = {"sll", "sll_sle"}  # paper 002's rows (SLL, SLL-ME, SLL-SLE)


def test_every_run_rewards_with_its_papers_convention() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert all("eos" in entry for entry in params["rewards"].values() if entry["kind"] != "clip_s")
    for name, run in params["runs"].items():
        reward = {**params["objectives"].get(run["method"], {}), **run.get("options", {})}.get("reward")
        if reward is None:
            continue
        eos = params["rewards"][reward]["eos"]
        assert eos is (run["method"] not in PAPER_002_METHODS), f"runs.{name}: reward {reward} (eos {eos})"


def test_each_papers_lstm_is_its_authors() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    models, runs = params["models"], params["runs"]
    assert {k: models["fc_lstm"].get(k, "input") for k in ("arch", "cell", "image")} == {"arch": "fc", "cell": "lstm",
                                                                                          "image": "input"}
    assert build_model("fc", {k: v for k, v in models["fc_lstm"].items() if k != "arch"}, 12, 5, 4).config.image == "input"
    assert {k: models["fc_lstm_state"][k] for k in ("arch", "cell", "image")} == {"arch": "fc", "cell": "lstm",
                                                                                   "image": "state"}
    assert {r["model"] for r in runs.values() if r["method"] in {"pg_spider", "mixer"}} == {"fc_lstm"}  # 001
    assert {r["model"] for r in runs.values() if r["method"] in PAPER_002_METHODS} == {"fc_lstm_state", "topdown"}
    video = params["datasets"]["synthetic_video"]["runs"]
    assert {runs[r]["model"] for r in video} == {"fc_lstm_state"}


# ---------------------------------------------------------------- the image as the LSTM's initial state

def test_image_as_initial_state_is_h0_and_c0() -> None:
    """Paper 002 sec. 4.3 / caption_competition ``Decoder._ft_step``: h_0 = c_0 = W f + b; the
    first input is the start token; the image is never an input."""
    torch.manual_seed(0)
    sizes = {"embed_size": 6, "hidden_size": 10, "dropout": 0.0, "cell": "lstm", "image": "state"}
    model = build_model("fc", sizes, 12, 5, 4)
    assert model.img_embed.out_features == 10
    pooled = torch.randn(3, 5)
    ctx = model.encode(pooled, torch.randn(3, 4, 5))
    h, c = model.init_state(ctx)
    want = pooled @ model.img_embed.weight.T + model.img_embed.bias
    torch.testing.assert_close(h, want)
    torch.testing.assert_close(c, want)
    words = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0]])
    timeshared.reset(model)
    loss = -model.teacher_forcing(ctx, words).sum()
    loss.backward()
    timeshared.check(model)
    assert model.img_embed.weight.grad.abs().sum() > 0
    assert type(model.lstm).__name__ == "LSTMCell"
    with pytest.raises(CaprlError, match="image 'both'"):
        build_model("fc", {**sizes, "image": "both"}, 12, 5, 4)
