"""CLIP-S and RefCLIP-S (Hessel et al. 2021): the formula on hand-made vectors and on a tiny random
CLIP (transformers' CLIPModel, no download), the listener embedding, the clip_s reward and its mix
(Cho et al. 2022), and the params keys."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from caprl import params as params_mod
from caprl.errors import CaprlError
from caprl.metrics.clip_model import ClipEmbedding
from caprl.metrics.clip_score import CLIP_S, REF_CLIP_S, ClipScorer, corpus_scores
from caprl.metrics.embeddings import EmbeddingSpec, ListenerEmbedding, clip_score_settings
from caprl.objectives.value import embedding_reward
from caprl.rewards import build_configured_reward, build_reward
from caprl.rewards.config import reward_config
from caprl.retrieval import Listener, ListenerConfig
from conftest import REPO, SCHEMA, default_params, merge
from toy import FEAT, WORDS, ToyData

W = 2.5  # Hessel et al.'s w


class Fixed:
    """An embedding of hand-made vectors (image id -> vector, caption text -> vector)."""

    name = "fixed"
    device = torch.device("cpu")

    def __init__(self, images: dict[int, list[float]], texts: dict[str, list[float]]) -> None:
        self.images, self.text_vectors, self.image_calls = images, texts, []

    def embed_images(self, image_ids: Sequence[int]) -> torch.Tensor:
        self.image_calls.append(list(image_ids))
        return F.normalize(torch.tensor([self.images[i] for i in image_ids]), dim=-1)

    def embed_texts(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        return F.normalize(torch.tensor([self.text_vectors[" ".join(c)] for c in captions]), dim=-1)


def test_the_formula_on_hand_made_vectors() -> None:
    """cos 0.6 -> CLIP-S 1.5; a negative cosine -> 0; RefCLIP-S = 2ab/(a+b) with the best reference
    (0.8, not the anti-correlated one); both terms 0 -> 0."""
    embedding = Fixed({1: [0.6, 0.8], 2: [-1.0, 0.0]},
                      {"x": [1.0, 0.0], "r1": [0.0, 1.0], "r2": [0.8, 0.6], "r3": [-1.0, 0.0]})
    scorer = ClipScorer(embedding, W, batch_size=2)
    per = scorer.scores([1, 2], [["x"], ["x"]], {1: [["r1"], ["r2"]], 2: [["r3"]]})
    assert per[CLIP_S].tolist() == pytest.approx([1.5, 0.0])
    assert per[REF_CLIP_S].tolist() == pytest.approx([2 * 1.5 * 0.8 / (1.5 + 0.8), 0.0])
    assert corpus_scores(scorer, {1: ["x"], 2: ["x"]}, {1: [["r1"], ["r2"]], 2: [["r3"]]}) == pytest.approx(
        {CLIP_S: 0.75, REF_CLIP_S: 2 * 1.5 * 0.8 / 2.3 / 2})
    scorer.clip_s([1, 2, 1], [["x"]] * 3)
    assert embedding.image_calls == [[1, 2]]  # each image embedded once, then cached


# ---------------------------------------------------------------- a tiny random CLIP

def tiny_clip(tmp_path: Path) -> tuple[Any, Any, Any]:
    """A randomly initialised CLIPModel (16-d, one layer), a character-level CLIP tokenizer and a
    32-pixel image processor, all built here (nothing downloaded)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    letters = list(string.ascii_lowercase)
    vocab = ["<|startoftext|>", "<|endoftext|>", *letters, *(c + "</w>" for c in letters)]
    (tmp_path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")  # no merges: one token per letter
    tokenizer = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), model_max_length=64)
    torch.manual_seed(3)
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 1},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 16},
        projection_dim=8)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return CLIPModel(config).eval(), tokenizer, processor


@pytest.mark.numerics
def test_clip_s_and_refclip_s_of_a_tiny_clip_match_a_hand_computation(tmp_path: Path) -> None:
    """Each caption's CLIP-S and RefCLIP-S against the formula computed by hand (numpy) on the
    model's own embeddings, one text and one image at a time, with Hessel et al.'s prompt; the
    scorer batches 2 at a time (padding must not change a caption's vector)."""
    model, tokenizer, processor = tiny_clip(tmp_path)
    rng = np.random.default_rng(0)
    paths = {}
    for i, size in zip((5, 7, 9), ((40, 48), (32, 32), (50, 36))):
        paths[i] = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(paths[i])
    captions = {5: "a red circle", 7: "two blue squares left of a circle", 9: "a square"}
    references = {5: ["a red circle", "one circle"], 7: ["blue squares"], 9: ["a green square", "square", "a square"]}

    with torch.no_grad():
        def text(words: str) -> np.ndarray:
            tokens = tokenizer(["A photo depicts " + words], return_tensors="pt")
            out = model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
            vec = (out if isinstance(out, torch.Tensor) else out.pooler_output)[0].numpy()
            return vec / np.linalg.norm(vec)

        def image(i: int) -> np.ndarray:
            pixels = processor(images=[Image.open(paths[i]).convert("RGB")], return_tensors="pt")["pixel_values"]
            out = model.get_image_features(pixel_values=pixels)
            vec = (out if isinstance(out, torch.Tensor) else out.pooler_output)[0].numpy()
            return vec / np.linalg.norm(vec)

        clip_hand = {i: W * max(float(text(c) @ image(i)), 0.0) for i, c in captions.items()}
        ref_hand = {i: max(max(float(text(c) @ text(r)) for r in references[i]), 0.0) for i, c in captions.items()}
    refclip_hand = {i: 2 * clip_hand[i] * ref_hand[i] / (clip_hand[i] + ref_hand[i]) if clip_hand[i] + ref_hand[i] else 0.0
                    for i in captions}
    assert any(v > 0 for v in clip_hand.values()) and any(v > 0 for v in refclip_hand.values())  # numbers, not 0s

    embedding = ClipEmbedding(model, tokenizer, processor, paths)
    scorer = ClipScorer(embedding, W, batch_size=2)
    ids = sorted(captions)
    per = scorer.scores(ids, [captions[i].split() for i in ids], {i: [r.split() for r in references[i]] for i in ids})
    # a CLIP forward on batches of 2 against 1, in float32 (the processor's pixels): a tolerance not derived
    assert per[CLIP_S].tolist() == pytest.approx([clip_hand[i] for i in ids], abs=1e-5)
    assert per[REF_CLIP_S].tolist() == pytest.approx([refclip_hand[i] for i in ids], abs=1e-5)
    corpus = corpus_scores(scorer, {i: captions[i].split() for i in ids}, {i: [r.split() for r in references[i]]
                                                                           for i in ids})
    assert corpus == pytest.approx({CLIP_S: np.mean(list(clip_hand.values())),
                                    REF_CLIP_S: np.mean(list(refclip_hand.values()))}, abs=1e-5)
    assert scorer.images.computed == 3  # every image embedded once over both calls


def test_a_missing_image_is_an_error_naming_it(tmp_path: Path) -> None:
    model, tokenizer, processor = tiny_clip(tmp_path)
    embedding = ClipEmbedding(model, tokenizer, processor, {1: tmp_path / "gone.png"})
    with pytest.raises(CaprlError, match=r"gone\.png: image not found \(image id 1\).*media_root"):
        embedding.embed_images([1])


# ---------------------------------------------------------------- the listener as the embedding

def toy_listener_embedding(seed: int = 0) -> tuple[Listener, ListenerEmbedding]:
    torch.manual_seed(seed)
    listener = Listener(ListenerConfig(word_size=8, hidden_size=12, margin=0.2), len(WORDS), FEAT).eval()
    index = {w: i for i, w in enumerate(WORDS)}
    return listener, ListenerEmbedding(listener, lambda words: [index.get(w, len(WORDS) - 1) for w in words],
                                       lambda ids: ToyData().features_of(ids, regions=False)[0])


@pytest.mark.numerics
def test_the_listener_variant_is_w_times_the_clamped_listener_cosine() -> None:
    """CLIP-S (listener) = 2.5 max(cos, 0) of the listener's caption and image embeddings: paper 003's
    embedding reward (its cosine) clamped and scaled; RefCLIP-S against the listener's reference cosines."""
    listener, embedding = toy_listener_embedding()
    captions = [["a", "red", "circle"], ["a", "blue", "square"], ["red"], ["a", "red", "square"]]
    ids = [0, 1, 2, 3]
    tokens = torch.tensor([[WORDS.index(w) for w in c] + [0] * (4 - len(c)) for c in captions])
    pooled = ToyData().features_of(ids, regions=False)[0]
    cosine = embedding_reward(listener, tokens, pooled)  # paper 003's reward: the same cosine
    assert (cosine > 0).any() and (cosine < 0).any()  # both branches of max(., 0) are checked
    scorer = ClipScorer(embedding, W, batch_size=3)
    # batches of 3 against 4 rows (other kernels) in float32, which ListenerEmbedding casts to: not derived
    assert scorer.clip_s(ids, captions).tolist() == pytest.approx((W * cosine.clamp(min=0)).tolist(), abs=1e-6)
    refs = {i: [["a", "red", "circle"], ["a", "blue", "square"]] for i in ids}
    ref_tokens = torch.tensor([[1, 2, 3, 0], [1, 4, 5, 0]])
    with torch.no_grad():
        ref_cos = (listener.embed_captions(tokens) @ listener.embed_captions(ref_tokens).t()).max(dim=1).values
    clip, ref = W * cosine.clamp(min=0), ref_cos.clamp(min=0)
    expected = torch.where(clip + ref > 0, 2 * clip * ref / (clip + ref), torch.zeros_like(clip))
    assert scorer.scores(ids, captions, refs)[REF_CLIP_S].tolist() == pytest.approx(expected.tolist(), abs=1e-6)


# ---------------------------------------------------------------- the reward kinds

CLIP_OPTIONS = {"embedding": "listener", "model": "openai/clip-vit-base-patch32", "listener": "listener",
                "prompt": "A photo depicts", "w": 2.5}
REFS = {i: [["a", "red", "circle"], ["a", "red", "circle", "left"]] for i in range(4)}


def test_the_registry_builds_clip_s_and_the_params_mix_with_cho_et_al_weights() -> None:
    """``clip_s`` is the scorer's CLIP-S of the embedding the options name; params.yaml's
    ``clip_s_cider_d`` is 2.0 CLIP-S + 1.0 CIDEr-D (Cho et al. 2022), each as built alone."""
    _, embedding = toy_listener_embedding()
    asked: list[EmbeddingSpec] = []

    def embeddings(spec: EmbeddingSpec) -> ListenerEmbedding:
        asked.append(spec)
        return embedding

    ids, captions = [0, 1, 2, 3], [["a", "red", "circle"], ["a", "blue"], ["red", "red"], []]
    clip = build_reward("clip_s", REFS, None, embeddings, **CLIP_OPTIONS)(ids, captions)
    assert clip.dtype == np.float64 and clip.tolist() == pytest.approx(
        ClipScorer(embedding, W, 4).clip_s(ids, captions).tolist())
    assert asked == [EmbeddingSpec("listener", "openai/clip-vit-base-patch32", "listener", "A photo depicts")]

    params = params_mod.load(REPO / "params.yaml")
    assert reward_config("clip_s_cider_d", params) == ("mix", {"weights": {"clip_s": 2.0, "cider_d": 1.0}, "eos": True,
                                                               **CLIP_OPTIONS})
    params["decode"]["max_length"] = 16
    mix = build_configured_reward("clip_s_cider_d", params, REFS, None, embeddings)
    cider = build_configured_reward("cider_d", params, REFS, None)(ids, captions)
    assert mix(ids, captions) == pytest.approx(2.0 * clip + 1.0 * cider)
    assert build_configured_reward("clip_s", params, REFS, None, embeddings)(ids, captions) == pytest.approx(clip)


def test_clip_s_options_are_checked_and_it_needs_an_embedding() -> None:
    params = params_mod.load(REPO / "params.yaml")
    with pytest.raises(CaprlError, match="reward clip_s needs an image-text embedding"):
        build_configured_reward("clip_s", params, REFS, None)
    bad = merge(params, {"rewards": {"clip_s": {"embedding": "clipp"}}})
    with pytest.raises(CaprlError, match=r"rewards\.clip_s\.embedding: must be one of clip, listener"):
        reward_config("clip_s", bad)
    short = {**params, "rewards": {"m": {"kind": "mix", "weights": {"clip_s": 1.0}, "embedding": "clip"}}}
    with pytest.raises(CaprlError, match=r"rewards\.m\.model: required by its component 'clip_s'"):
        reward_config("m", short)
    with pytest.raises(CaprlError, match=r"rewards\.c\.w: must be a positive number"):
        reward_config("c", {"rewards": {"c": {"kind": "clip_s", **CLIP_OPTIONS, "w": 0}}})


# ---------------------------------------------------------------- params keys

def test_the_schema_validates_the_clip_score_keys() -> None:
    params = default_params()
    params_mod.validate(params, SCHEMA)
    assert clip_score_settings(params, "synthetic").spec.embedding == "listener"
    assert clip_score_settings(params, "coco").spec.embedding == "clip"  # the real sets: CLIP itself
    assert clip_score_settings(params, "synthetic_video") is None
    for bad, key in [({"evaluate": {"clip_score": {"embedding": "clipp"}}}, "evaluate.clip_score.embedding"),
                     ({"evaluate": {"clip_score": {"w": -1}}}, "evaluate.clip_score.w"),
                     ({"datasets": {"coco": {"clip_score": {"modle": "x"}}}}, "datasets.coco.clip_score")]:
        with pytest.raises(CaprlError, match=key.replace(".", r"\.")):
            params_mod.validate(merge(params, bad), SCHEMA)
    missing = merge(params, {})
    del missing["evaluate"]["clip_score"]["prompt"]
    with pytest.raises(CaprlError, match="prompt"):
        params_mod.validate(missing, SCHEMA)


# ---------------------------------------------------------------- the evaluation's section and the main table

def test_the_score_files_section_and_the_main_tables_columns() -> None:
    """Without its input (the listener run does not train on the dataset) the section says why CLIP-S
    is unavailable; the main table shows the listener's CLIP-S x100 where score files hold it, — for a
    file of another embedding, and no columns where no score file holds one."""
    from caprl.evaluation.clip_score import clip_score_report, unavailable
    from caprl.metrics.embeddings import EmbeddingInputs
    from caprl.tables.build import main_table

    params = default_params()
    section = clip_score_report(params, "synthetic", None, EmbeddingInputs(), {1: "a red circle"},
                                {1: [["a", "red", "circle"]]}, torch.device("cpu"))
    assert section is not None and section["label"] == "CLIP-S (listener)" and "metrics" not in section
    assert "no --embedding-listener was given" in unavailable(section)["CLIP-S (listener)"]
    assert clip_score_report(params, "synthetic_video", None, EmbeddingInputs(), {}, {}, torch.device("cpu")) is None

    params["runs"] = {name: {"method": method, "model": "fc"} for name, method in
                      (("fc-xe", "xe"), ("fc-scst", "scst"), ("fc-old", "scst"))}
    metrics = {"BLEU-4": 0.2, "CIDEr-D": 1.1}
    listener = {"label": "CLIP-S (listener)", "metrics": {CLIP_S: 1.25, REF_CLIP_S: 0.5}}
    scores = {"fc-xe": {"run": "fc-xe", "metrics": metrics, "clip_score": listener},
              "fc-scst": {"run": "fc-scst", "metrics": metrics, "clip_score": {**listener, "label": "CLIP-S"}},
              "fc-old": {"run": "fc-old", "metrics": metrics}}
    table = main_table(params, "synthetic", scores)
    assert table.columns[-2:] == ["CLIP-S (listener)", "RefCLIP-S (listener)"]
    rows = {label: [c.text() for c in row] for label, row in table.rows}
    assert rows["fc (XE) [fc-xe]"][-2:] == ["125.0", "50.0"]
    assert rows["fc (SCST) [fc-scst]"][-2:] == rows["fc (SCST) [fc-old]"][-2:] == ["—", "—"]
    assert any(n.startswith("CLIP-S (listener) = 2.5 max(cos(caption, image), 0)") and "not CLIP" in n
               for n in table.notes)
    del scores["fc-xe"]["clip_score"]
    assert not any("CLIP-S" in c for c in main_table(params, "synthetic", scores).columns)
