"""Vocabulary used and novel captions (self-critical.pytorch's vocab_size, novel_sentences): the
counts on toy captions, the main table's columns, and the score files of ``caprl evaluate`` and
``caprl baseline`` run as the workflow runs them."""

from __future__ import annotations

from typing import Any

import pytest

from caprl import io
from caprl.errors import CaprlError
from caprl.evaluation.vocabulary import caption_stats, training_captions
from caprl.tables import build
from caprl.tables.build import main_table

METRICS = {"BLEU-1": 0.5, "BLEU-2": 0.4, "BLEU-3": 0.3, "BLEU-4": 0.2, "METEOR": 0.25, "ROUGE-L": 0.45,
           "CIDEr-D": 1.1}


def annotations() -> dict[str, Any]:
    images = [("train", [["a", "dog", "runs"], ["a", "cat"]]), ("train", [["a", "dog", "runs"]]),
              ("val", [["a", "red", "bus"]]), ("test", [["two", "birds"]])]
    return {"dataset": "toy", "images": [{"id": k, "file": f"{k}.jpg", "split": split, "captions": caps,
                                          "raw": [" ".join(c) for c in caps]} for k, (split, caps) in enumerate(images)]}


def test_vocabulary_and_novel_captions_by_hand() -> None:
    train = training_captions(annotations())
    assert train == {"a dog runs", "a cat"}  # train split only, each distinct caption once
    captions = {1: "a dog runs", 2: "a  cat", 3: "a red bus", 4: "two birds", 5: "two birds", 6: ""}
    got = caption_stats(captions, train)
    # words: a, dog, runs, cat, red, bus, two, birds; novel: a red bus (a val caption), two birds twice, ""
    assert got == {"vocab_size": 8, "novel_sentences": pytest.approx(4 / 6), "captions": 6, "novel_captions": 4,
                   "training_captions": 2}
    assert caption_stats(captions, [["a", "dog", "runs"], ["a", "cat"]]) == got  # token lists work alike
    assert caption_stats({1: "a cat", 2: "a cat"}, train)["novel_sentences"] == 0.0
    with pytest.raises(CaprlError, match="no captions"):
        caption_stats({}, train)


def table_params() -> dict[str, Any]:
    return {"datasets": {"synthetic": {"enabled": True}}, "evaluate": {"split": "test", "greedy": True, "diversity": {"methods": [], "samples": 5, "beams": 5, "examples": 2}},
            "decode": {"method": "beam", "beam_size": 5}, "models": {"fc": {"arch": "fc"}},
            "objectives": {"xe": {}, "scst": {"reward": "cider_d"}, "pg_spider": {"reward": "cider_d"}},
            "rewards": {"cider_d": {"kind": "cider_d"}, "spider": {"kind": "mix",
                                                                  "weights": {"cider_d": 0.5, "spice": 0.5}}},
            "spice": {"corenlp_dir": None},
            "runs": {"fc-xe": {"method": "xe", "model": "fc"},
                     "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}},
                     "fc-old": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}},
                     "fc-missing": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}},
                     "fc-spider": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"},
                                   "options": {"reward": "spider"}}}}


def test_main_table_has_vocabulary_and_novel_columns_after_the_existing_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "reward_unavailable_reason", lambda name, p: "no SPICE" if name == "spider" else None)
    vocab = {"vocab_size": 412, "novel_sentences": 0.3125, "captions": 16, "novel_captions": 5,
             "training_captions": 80}
    failure = {"bad_endings": 0.125, "repeated_bigrams": 0.04, "mean_length": 9.25, "captions": 16,
               "bad_ending_captions": 2}  # an XE run: no start, no KL (—)
    scores = {"fc-xe": {"run": "fc-xe", "metrics": METRICS, "greedy": {"metrics": {"CIDEr-D": 0.9}},
                        "vocabulary": vocab, "failure_modes": failure},
              "fc-scst": {"run": "fc-scst", "metrics": METRICS, "vocabulary": {**vocab, "vocab_size": 57,
                                                                                "novel_sentences": 0.0},
                          "warnings": [{"message": "every caption is empty"}]},
              "fc-old": {"run": "fc-old", "metrics": METRICS},  # scored before the section existed
              "most-frequent": {"run": "most-frequent", "metrics": METRICS,
                                "vocabulary": {**vocab, "vocab_size": 9, "novel_sentences": 0.0}}}
    table = main_table(table_params(), "synthetic", scores)
    assert table.columns == ["B@1", "B@2", "B@3", "B@4", "M", "R", "C", "S", "C greedy", "Vocab", "Novel %",
                             "Bad end %", "Rep-2 %", "Len", "KL start"]
    cells = {label: [c.text() for c in row] for label, row in table.rows}
    existing = ["50.0", "40.0", "30.0", "20.0", "25.0", "45.0", "110.0", "—"]
    old = ["not evaluated"] * 4  # score files written before the failure_modes section
    assert cells["fc (XE) [fc-xe]"] == existing + ["90.0", "412", "31.2", "12.5", "4.0", "9.2", "—"]
    assert cells["fc (SCST) [fc-scst]"] == existing + ["—", "57", "0.0"] + old
    assert cells["fc (SCST) [fc-old]"] == existing + ["—", "not evaluated", "not evaluated"] + old
    assert cells["fc (SCST) [fc-missing]"] == ["—"] * 15
    assert cells["fc (PG-SPIDEr) [fc-spider]"] == ["unavailable"] * 15
    assert cells["most frequent training caption"] == existing + ["110.0", "9", "0.0"] + old
    scst = dict(table.rows)["fc (SCST) [fc-scst]"]
    assert all(c.flags for c in scst[:7] + scst[-6:-4])  # the degenerate run's new cells are flagged as its others
    assert any(n.startswith("Vocab: distinct words") for n in table.notes)
    assert any("Rep-2 % = seq-rep-2" in n for n in table.notes)
    md = table.markdown()
    assert "| C greedy | Vocab | Novel % | Bad end % | Rep-2 % | Len | KL start |" in md
    assert "| fc (XE) [fc-xe] | 50.0 | 40.0 | 30.0 | 20.0 | 25.0 | 45.0 | 110.0 | — | 90.0 | 412 | 31.2 | 12.5 |" in md


def test_sle_table4_self_cider_column_and_older_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table 4's Self-CIDEr beside Div-1, Div-2, mBLEU-4 (2 decimals, no paper number); a diversity
    section written before Self-CIDEr shows "not evaluated" there and the same numbers elsewhere."""
    from test_tables_sle import all_scores, sle_params

    from caprl.tables.sle import sle_table4

    params = sle_params()
    scores = all_scores(params, "coco")
    before = {label: [c.text() for c in row[:4]] for label, row in sle_table4(params, "coco", scores).rows}
    for decoding in ("rs", "bs"):
        scores["fc_lstm_state-sll_sle"]["diversity"][decoding].pop("Self-CIDEr")
    table = sle_table4(params, "coco", scores)
    assert table.columns[-1] == "Self-CIDEr"
    cells = {label: [c.text() for c in row] for label, row in table.rows}
    assert {label: texts[:4] for label, texts in cells.items()} == before
    assert cells["fc_lstm_state (SLL-SLE, rs) [fc_lstm_state-sll_sle]"][-1] == "not evaluated"
    assert cells["fc_lstm_state (SLL, rs) [fc_lstm_state-sll]"][-1] == "0.71"
    assert cells["fc_lstm_state (SLL, bs) [fc_lstm_state-sll]"][-1] == "0.52"
    assert any("Self-CIDEr (Wang & Chan, CVPR 2019" in n for n in table.notes)


def test_evaluate_and_baseline_write_the_vocabulary_and_failure_sections(research_dataset: Any) -> None:
    """The real stages on the TINY synthetic set: an fc-xe model that says 'a' at every step (a caption
    no training caption is) and the most-frequent training caption (a training caption)."""
    from stage_inputs import caprl, degenerate_checkpoint

    dataset = research_dataset
    out = dataset.workdir / "vocabulary"
    ckpt = degenerate_checkpoint(dataset, "fc-xe", "xe", "a", out / "fc-xe.pt")
    common = ("--refs", dataset.references["test"])
    proc = caprl("evaluate", dataset.params, "--dataset", "synthetic", "--run", "fc-xe", "--checkpoint", ckpt,
                 "--annotations", dataset.annotations, "--vocab", dataset.vocab, "--labels", dataset.labels,
                 "--features", dataset.features, *common, "--out-captions", out / "xe" / "captions.json",
                 "--out-scores", out / "xe" / "scores.json", "--out-examples", out / "xe" / "examples.json",
                 "--start", ckpt, cwd=dataset.workdir)  # its own start: KL 0
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = caprl("baseline", dataset.params, "--dataset", "synthetic", "--annotations", dataset.annotations, *common,
                 "--out-captions", out / "base" / "captions.json", "--out-scores", out / "base" / "scores.json",
                 "--out-examples", out / "base" / "examples.json", cwd=dataset.workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = training_captions(io.read_json(dataset.annotations))
    xe, most = (io.read_json(out / name / "scores.json") for name in ("xe", "base"))
    captions = {c["image_id"]: c["caption"] for c in io.read_json(out / "xe" / "captions.json")}
    assert set(captions.values()) == {" ".join(["a"] * len(next(iter(captions.values())).split()))}
    assert xe["vocabulary"] == {"vocab_size": 1, "novel_sentences": 1.0, "captions": len(captions),
                                "novel_captions": len(captions), "training_captions": len(train)}
    assert most["vocabulary"]["vocab_size"] == len(most["caption"].split())
    assert most["vocabulary"]["novel_sentences"] == 0.0 and most["caption"] in train
    words = len(next(iter(captions.values())).split())  # 'a a ... a': ends on 'a', every pair a repeat but one
    assert xe["failure_modes"] == {"bad_endings": 1.0, "repeated_bigrams": pytest.approx(1 - 1 / (words - 1)),
                                   "mean_length": words, "captions": len(captions),
                                   "bad_ending_captions": len(captions), "kl_to_start": 0.0, "start_run": "fc-xe"}
    assert most["failure_modes"]["mean_length"] == len(most["caption"].split())
    diversity = xe["diversity"]  # xe is a diversity method: Self-CIDEr of sets of one repeated caption
    assert diversity["rs"]["Self-CIDEr"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 <= diversity["bs"]["Self-CIDEr"] <= 1.0
