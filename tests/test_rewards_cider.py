"""CIDEr-D reward: parity with pycocoevalcap's CiderScorer on real COCO text, no table growth."""

from __future__ import annotations

import tracemalloc
from collections import defaultdict

import numpy as np
import pytest
from conftest_rewards import coco_tokens, held_out, perturb
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

from caprl.errors import CaprlError
from caprl.rewards import DocumentFrequencies, build_reward, compute_document_frequencies

N_IMAGES = 500


def official_cider(image_ids, captions, refs) -> np.ndarray:
    """pycocoevalcap's Cider: document frequencies from the references it is given."""
    gts = {k: [" ".join(r) for r in refs[i]] for k, i in enumerate(image_ids)}
    res = {k: [" ".join(c)] for k, c in enumerate(captions)}
    return np.asarray(Cider().compute_score(gts, res)[1])


def test_document_frequencies_match_cider_scorer():
    ids, _, refs = held_out(N_IMAGES)
    scorer = CiderScorer(n=4, sigma=6.0)
    for i in ids:
        scorer += (None, [" ".join(r) for r in refs[i]])
    scorer.compute_doc_freq()
    df = compute_document_frequencies(refs)
    assert df.num_documents == N_IMAGES
    assert df.to_dict() == {k: int(v) for k, v in scorer.document_frequency.items()}


@pytest.mark.parametrize("kind", ["held_out", "perturbed"])
def test_cider_d_equals_pycocoevalcap_per_caption(kind):
    ids, cands, refs = held_out(N_IMAGES)
    if kind == "perturbed":
        vocab = sorted({w for caps in refs.values() for c in caps for w in c})
        cands = perturb(cands, vocab)
    reward = build_reward("cider_d", refs, compute_document_frequencies(refs))
    ours = reward(ids, cands)
    theirs = official_cider(ids, cands, refs)
    assert ours.dtype == np.float64 and ours.shape == (N_IMAGES,)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    assert theirs.std() > 0.1  # the comparison is not between constants


def test_cider_d_with_document_frequencies_of_another_corpus():
    """df from all 5,000 test images, scoring 300 of them (the self-critical set-up)."""
    tokens = coco_tokens()
    corpus_df = compute_document_frequencies(tokens)
    ids, cands, refs = held_out(300)
    vocab = sorted({w for caps in tokens.values() for c in caps for w in c})
    cands = perturb(cands, vocab, seed=1)
    scorer = CiderScorer(n=4, sigma=6.0)
    for i, c in zip(ids, cands):
        scorer += (" ".join(c), [" ".join(r) for r in refs[i]])
    scorer.document_frequency = defaultdict(float, {k: float(v) for k, v in corpus_df.to_dict().items()})
    theirs = np.asarray(scorer.compute_cider())  # uses ref_len = log(len(batch))
    same_n = DocumentFrequencies(corpus_df.words, corpus_df.ngrams, corpus_df.counts, len(ids))
    ours = build_reward("cider_d", refs, same_n)(ids, cands)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)


def test_batch_order_and_size_do_not_matter():
    ids, cands, refs = held_out(60)
    reward = build_reward("cider_d", refs)
    # six candidates per image, shuffled, scored in one batch and one by one
    rng = np.random.default_rng(0)
    batch_ids = [i for i in ids for _ in range(6)]
    batch_caps = [list(refs[i][k % len(refs[i])]) + (["a"] * (k % 3)) for i in ids for k in range(6)]
    order = rng.permutation(len(batch_ids))
    together = reward([batch_ids[o] for o in order], [batch_caps[o] for o in order])
    alone = np.array([reward([batch_ids[o]], [batch_caps[o]])[0] for o in order])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-12)
    assert len(reward([], [])) == 0


def test_unseen_ngrams_add_nothing_and_memory_stays_flat():
    ids, _, refs = held_out(50)
    reward = build_reward("cider_d", refs)
    table = reward.refs.table
    before = (table.size, [k.copy() for k in table.keys], len(reward.refs.word_index), reward.idf.copy())
    rng = np.random.default_rng(0)
    batch_ids = ids * 6

    def unseen_batch():
        return [[f"never{x}" for x in row] for row in rng.integers(10**12, size=(len(batch_ids), 12)).tolist()]

    for _ in range(5):
        reward(batch_ids, unseen_batch())
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for _ in range(100):
        scores = reward(batch_ids, unseen_batch())
    end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert np.all(scores == 0)
    assert end - start < 256 * 1024, f"memory grew by {(end - start) / 1024:.0f} KiB over 100 batches"
    assert table.size == before[0] and len(reward.refs.word_index) == before[2]
    assert all(np.array_equal(a, b) for a, b in zip(table.keys, before[1]))
    assert np.array_equal(reward.idf, before[3])


def test_sigma_option_and_errors():
    refs = {1: [["a", "dog", "runs", "on", "the", "grass"]], 2: [["a", "cat"]]}
    short = [["a", "dog"]]
    default = build_reward("cider_d", refs)([1], short)[0]
    wide = build_reward("cider_d", refs, sigma=60.0)([1], short)[0]
    assert wide > default > 0
    with pytest.raises(CaprlError, match="image id 3"):
        build_reward("cider_d", refs)([3], short)
    with pytest.raises(CaprlError, match="2 image ids but 1 captions"):
        build_reward("cider_d", refs)([1, 2], short)
    with pytest.raises(CaprlError, match="lists of words"):
        build_reward("cider_d", refs)([1], ["a dog"])


def test_end_token_option_equals_pycocoevalcap_on_eos_terminated_text():
    """``eos: true``: self-critical.pytorch's reward text (``array_to_str`` keeps the end token of
    every ended caption and of every reference, ``prepro_ngrams.py`` counts documents with it):
    pycocoevalcap's scorer on the same words with ``<eos>`` appended gives the same numbers."""
    ids, cands, refs = held_out(300)
    vocab = sorted({w for caps in refs.values() for c in caps for w in c})
    cands = perturb(cands, vocab, seed=2)
    max_length = 12  # some candidates and references run to the limit: no end appended there
    assert any(len(c) >= max_length for c in cands) and any(len(c) < max_length for c in cands)
    ours = build_reward("cider_d", refs, compute_document_frequencies(refs), eos=True, max_length=max_length)(ids, cands)

    def end(words):
        return " ".join(words) + (" <eos>" if len(words) < max_length else "")

    scorer = CiderScorer(n=4, sigma=6.0)
    for i, c in zip(ids, cands):
        scorer += (end(c), [end(r) for r in refs[i]])
    scorer.compute_doc_freq()  # recomputed below on the corpus with <eos> after every reference
    df = compute_document_frequencies({i: [[*r, "<eos>"] for r in refs[i]] for i in ids})
    scorer.document_frequency = defaultdict(float, {k: float(v) for k, v in df.to_dict().items()})
    theirs = np.asarray(scorer.compute_cider())
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    plain = build_reward("cider_d", refs, compute_document_frequencies(refs))(ids, cands)
    assert np.abs(ours - plain).max() > 0.01  # the option changes the numbers


def test_end_token_penalises_a_caption_cut_mid_phrase():
    """The reason SCP's reward counts the end: a caption that stops before its last words loses
    the references' "last word, end" n-grams, so the cut caption's reward falls further."""
    refs = {1: [["a", "red", "circle", "above", "a", "blue", "square"]] * 3 + [["a", "blue", "square", "below", "a",
                                                                             "red", "circle"]] * 2,
            2: [["a", "green", "triangle"]] * 5}
    full, cut = ["a", "red", "circle", "above", "a", "blue", "square"], ["a", "red", "circle", "above", "a", "blue"]
    plain = build_reward("cider_d", refs)
    ended = build_reward("cider_d", refs, eos=True, max_length=16)
    assert ended([1], [full])[0] > 0 and plain([1], [full])[0] > 0
    assert ended([1], [cut])[0] / ended([1], [full])[0] < plain([1], [cut])[0] / plain([1], [full])[0]
    with pytest.raises(CaprlError, match="document frequencies count"):
        build_reward("cider_d", refs, compute_document_frequencies({1: refs[1]}), eos=True)
