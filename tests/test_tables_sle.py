"""The SLE paper's tables (Tables 2-4) and samples view (Fig. 2 / 4) from hand-made score files."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from caprl.tables import sle_numbers as paper
from caprl.tables.build import TABLES, build_tables
from caprl.tables.render import Cell, Table
from caprl.tables.sle import has_attention, sle_models, sle_samples, sle_table2, sle_table3, sle_table4
from conftest import REPO, default_params

PAPER_TEXT = REPO.parent / "shared" / "papers" / "002_5a024678a14e9bf6.txt"
SPICE_REASON = "java not found on PATH"
IDS = [3, 7]  # the example images of every score file


def sle_params() -> dict[str, Any]:
    """The repository's params.yaml with the paper's datasets (coco, tgif) enabled, every run
    training on every dataset (no dataset's own ``runs:`` list)."""
    params = default_params()
    for ds in ("coco", "tgif"):
        params["datasets"][ds]["enabled"] = True
    for spec in params["datasets"].values():
        spec.pop("runs", None)
    return params


def diversity(run: str, ids: list[int] = IDS, rs: dict[str, float] | None = None) -> dict[str, Any]:
    return {"settings": {"samples": 5, "beams": 5, "seed": 1234, "precision": {"rs": "mean", "bs": "top"}},
            "rs": rs or {"CIDEr-D": 1.02, "Div-1": 0.31, "Div-2": 0.42, "mBLEU-4": 0.61, "Self-CIDEr": 0.71},
            "bs": {"CIDEr-D": 1.10, "Div-1": 0.27, "Div-2": 0.36, "mBLEU-4": 0.76, "Self-CIDEr": 0.52},
            "examples": [{"image_id": i, "references": [f"reference {j} of image {i}" for j in range(5)],
                          "rs": [f"{run} sample {j} of image {i}" for j in range(5)],
                          "bs": [f"{run} beam {j} of image {i}" for j in range(5)]} for i in ids]}


def score(params: dict[str, Any], run: str, dataset: str, metrics: dict[str, float] | None = None,
          with_diversity: bool = True, **div: Any) -> dict[str, Any]:
    entry = params["runs"][run]
    report = {"run": run, "dataset": dataset, "method": entry["method"], "model": entry["model"],
              "options": entry.get("options", {}), "decode": "beam", "beam_size": 5, "split": "test",
              "n_images": 16, "metrics": metrics or {"METEOR": 0.27, "CIDEr-D": 1.15, "BLEU-4": 0.3},
              "unavailable": {"SPICE": SPICE_REASON}}
    if with_diversity:
        report["diversity"] = diversity(run, **div)
    return report


def all_scores(params: dict[str, Any], dataset: str) -> dict[str, Any]:
    """A score file (with a diversity section) for every XE, SCST and SLL-family run of fc_lstm_state (paper
    002's model without attention) and topdown; the SCST runs are never an SLL row."""
    runs = [r for r, e in params["runs"].items() if e["model"] in ("fc_lstm_state", "topdown")
            and e["method"] in ("xe", "scst", "sll", "sll_sle")]
    return {run: score(params, run, dataset) for run in runs}


def rows(table: Table) -> dict[str, list[Cell]]:
    return dict(table.rows)


def labels(table: Table) -> list[str]:
    return [label for label, _ in table.rows]


def texts(cells: list[Cell]) -> list[str]:
    return [c.text() for c in cells]


def renamed(params: dict[str, Any], new: dict[str, str]) -> dict[str, Any]:
    """params with runs renamed (init references and datasets' run lists follow)."""
    out = copy.deepcopy(params)
    out["runs"] = {}
    for name, entry in params["runs"].items():
        entry = copy.deepcopy(entry)
        entry["init"] = {role: new.get(r, r) for role, r in entry.get("init", {}).items()}
        out["runs"][new.get(name, name)] = entry
    for ds in out["datasets"].values():
        if "runs" in ds:
            ds["runs"] = [new.get(r, r) for r in ds["runs"]]
    return out


# ---------------------------------------------------------------- rows from params


def test_tables_are_registered_and_listed() -> None:
    params = sle_params()
    assert {"sle_table2", "sle_table3", "sle_table4", "sle_samples"} <= set(TABLES)
    built = build_tables(params, "synthetic_video", all_scores(params, "synthetic_video"))
    assert list(built) == ["main", "sle_table3", "sle_table4", "sle_samples"]
    assert {"sle_table2", "sle_table4", "sle_samples"} <= set(build_tables(params, "synthetic", {}))


def test_attention_from_the_architecture() -> None:
    params = sle_params()
    assert [m for m in params["models"] if has_attention(params, m)] == ["topdown", "softatt", "stackcap_star",
                                                                         "stackcap"]
    params["models"] = {"td": params["models"]["topdown"], **params["models"]}  # attention model listed first
    params["runs"]["td-sll"] = {"method": "sll", "model": "td"}
    assert sle_models(params, "synthetic") == ["fc_lstm_state", "td", "topdown"]  # without attention first


def test_rows_are_found_by_method_and_entropy_not_by_name() -> None:
    params = sle_params()
    new = {run: f"run{i}" for i, run in enumerate(params["runs"])}
    params = renamed(params, new)
    scores = {new[r]: {**s, "run": new[r]} for r, s in all_scores(sle_params(), "synthetic").items()}
    scores[new["fc_lstm_state-sll_me"]]["metrics"] = {"METEOR": 0.2}
    table = sle_table2(params, "synthetic", scores)
    assert labels(table) == [f"fc_lstm_state (SLL) [{new['fc_lstm_state-sll']}]",
                             f"fc_lstm_state (SLL-ME) [{new['fc_lstm_state-sll_me']}]",
                             f"fc_lstm_state (SLL-SLE) [{new['fc_lstm_state-sll_sle']}]",
                             f"topdown (SLL*) [{new['topdown-sll']}]",
                             f"topdown (SLL-ME*) [{new['topdown-sll_me']}]",
                             f"topdown (SLL-SLE*) [{new['topdown-sll_sle']}]"]
    assert rows(table)[f"fc_lstm_state (SLL-ME) [{new['fc_lstm_state-sll_me']}]"][0].ours == pytest.approx(20.0)
    # an sll run with entropy set to 0 is SLL; a second SLL-ME run is a second, named row
    params["runs"]["x"] = {"method": "sll", "model": "fc_lstm_state", "options": {"entropy": 0.0}}
    params["runs"]["y"] = {"method": "sll", "model": "fc_lstm_state", "options": {"entropy": 0.1}}
    params["runs"]["z"] = {"method": "scst", "model": "fc_lstm_state"}
    got = labels(sle_table2(params, "synthetic", scores))
    assert got[:5] == [f"fc_lstm_state (SLL) [{new['fc_lstm_state-sll']}]", "fc_lstm_state (SLL) [x]",
                       f"fc_lstm_state (SLL-ME) [{new['fc_lstm_state-sll_me']}]", "fc_lstm_state (SLL-ME) [y]",
                       f"fc_lstm_state (SLL-SLE) [{new['fc_lstm_state-sll_sle']}]"]
    # an scst run (SCP's reward text) is never an SLL row, even of a model without an sll run of entropy 0
    del params["runs"][new["topdown-sll"]]
    got = labels(sle_table2(params, "synthetic", scores))
    assert not any(f"[{run}]" in label for label in got for run in ("z", new["topdown-scst"]))
    assert "topdown (SLL*): no run" in got


def test_missing_run_or_kind_shows_a_dash() -> None:
    params = sle_params()
    scores = all_scores(params, "synthetic")
    del scores["fc_lstm_state-sll_sle"]
    del params["runs"]["topdown-sll_me"]
    t2 = rows(sle_table2(params, "synthetic", scores))
    assert texts(t2["fc_lstm_state (SLL-SLE) [fc_lstm_state-sll_sle]"]) == ["—", "—", "—"]
    assert texts(t2["topdown (SLL-ME*): no run"]) == ["—", "—", "—"]
    t4 = rows(sle_table4(params, "synthetic", scores))
    assert texts(t4["fc_lstm_state (SLL-SLE, rs) [fc_lstm_state-sll_sle]"]) == ["—"] * 5
    assert texts(t4["topdown (SLL-ME*, bs): no run"]) == ["—"] * 5


def test_run_that_cannot_train_here_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.tables import build

    params = sle_params()
    params["runs"]["fc_lstm_state-sll_sle"]["options"] = {"reward": "spider"}
    monkeypatch.setattr(build, "reward_unavailable_reason", lambda name, p: "no SPICE" if name == "spider" else None)
    scores = all_scores(params, "synthetic")
    del scores["fc_lstm_state-sll_sle"]
    t2, t4 = sle_table2(params, "synthetic", scores), sle_table4(params, "synthetic", scores)
    assert texts(rows(t2)["fc_lstm_state (SLL-SLE) [fc_lstm_state-sll_sle]"]) == ["unavailable"] * 3
    assert texts(rows(t4)["fc_lstm_state (SLL-SLE, bs) [fc_lstm_state-sll_sle]"]) == ["unavailable"] * 5
    assert "fc_lstm_state-sll_sle: unavailable, not trained here: no SPICE." in t2.notes
    assert t4.notes.count("fc_lstm_state-sll_sle: unavailable, not trained here: no SPICE.") == 1


def test_no_sle_run_says_so() -> None:
    params = sle_params()
    params["runs"] = {r: e for r, e in params["runs"].items() if e["method"] not in ("sll", "sll_sle")}
    for build in (sle_table2, sle_table4, sle_samples):
        table = build(params, "synthetic", {})
        assert table.rows == [] and "No sll / sll_sle run trains on synthetic." in " ".join(table.notes)
        table.markdown(), table.csv(), table.latex()


# ---------------------------------------------------------------- Tables 2 and 3


def test_table2_carries_the_paper_numbers_on_coco_only() -> None:
    params = sle_params()
    table = sle_table2(params, "coco", all_scores(params, "coco"))
    cells = rows(table)
    assert labels(table)[:6] == [f"{label} [paper]" for label, _ in paper.TABLE2_PRIOR]
    assert texts(cells["NIC [32] [paper]"]) == ["— (paper 23.7)", "— (paper 85.5)", "—"]  # NA in the paper
    assert texts(cells["Top-Down-SLL [2] [paper]"]) == ["— (paper 26.5)", "— (paper 111.1)", "— (paper 20.2)"]
    fc_sle = cells["fc_lstm_state (SLL-SLE) [fc_lstm_state-sll_sle]"]
    assert [(c.ours, c.paper) for c in fc_sle[:2]] == [(pytest.approx(27.0), 27.0), (pytest.approx(115.0), 117.2)]
    assert texts(fc_sle) == ["27.0 (paper 27.0, +0.0)", "115.0 (paper 117.2, -2.2)", "— (paper 20.3)"]
    assert texts(cells["fc_lstm_state (SLL) [fc_lstm_state-sll]"])[:2] == ["27.0 (paper 26.8, +0.2)",
                                                                          "115.0 (paper 115.0, +0.0)"]
    assert [c.paper for c in cells["fc_lstm_state (SLL-ME) [fc_lstm_state-sll_me]"]] == [26.8, 115.6, 20.1]
    assert [c.paper for c in cells["topdown (SLL*) [topdown-sll]"]] == [26.6, 117.2, 19.4]  # the * rows
    assert [c.paper for c in cells["topdown (SLL-ME*) [topdown-sll_me]"]] == [26.7, 117.9, 19.5]
    assert [c.paper for c in cells["topdown (SLL-SLE*) [topdown-sll_sle]"]] == [27.0, 119.6, 19.9]
    assert "SPICE: not computed (java not found on PATH)." in table.notes
    assert table.title == "coco test split: SLE (Chen & Jin, CVPR 2020) Table 2, image captioning (beam 5)"
    for ds in ("synthetic", "tgif"):
        other = sle_table2(params, ds, all_scores(params, ds))
        assert not any("[paper]" in label for label in labels(other))
        assert all(c.paper is None for _, cs in other.rows for c in cs)
        assert any("paper numbers are shown on coco" in n for n in other.notes)


def test_table3_carries_the_paper_numbers_on_tgif_only() -> None:
    params = sle_params()
    table = sle_table3(params, "tgif", all_scores(params, "tgif"))
    cells = rows(table)
    assert labels(table)[:2] == ["Official [15] [paper]", "Show-adapt [7] [paper]"]
    assert texts(cells["Show-adapt [7] [paper]"]) == ["— (paper 16.2)", "— (paper 29.8)", "—"]
    # the text's assignment of the printed-swapped rows (see the next test)
    assert texts(cells["fc_lstm_state (SLL) [fc_lstm_state-sll]"])[:2] == ["27.0 (paper 18.2, +8.8)",
                                                                          "115.0 (paper 48.1, +66.9)"]
    assert [c.paper for c in cells["fc_lstm_state (SLL-ME) [fc_lstm_state-sll_me]"]] == [17.8, 45.9, 15.9]
    assert [c.paper for c in cells["fc_lstm_state (SLL-SLE) [fc_lstm_state-sll_sle]"]] == [18.8, 50.8, 16.6]
    assert all(c.paper is None for c in cells["topdown (SLL*) [topdown-sll]"])  # the paper has no attention rows
    assert "no paper numbers for topdown (with attention)" in " ".join(table.notes)
    assert "TGIF" in " ".join(table.notes) and "Table 3" in table.title
    for ds in ("synthetic_video", "coco"):
        other = sle_table3(params, ds, all_scores(params, ds))
        assert all(c.paper is None for _, cs in other.rows for c in cs)
        assert any("paper numbers are shown on tgif" in n for n in other.notes)


# ---------------------------------------------------------------- Table 4


def test_table4_rows_cells_and_paper_numbers_on_coco() -> None:
    params = sle_params()
    scores = all_scores(params, "coco")
    scores["fc_lstm_state-sll_sle"]["diversity"]["rs"] = {"CIDEr-D": 1.16, "Div-1": 0.304, "Div-2": 0.4,
                                                          "mBLEU-4": 0.655, "Self-CIDEr": 0.704}
    table = sle_table4(params, "coco", scores)
    assert table.columns == ["CIDEr-D", "Div-1", "Div-2", "mBLEU-4", "Self-CIDEr"]
    fc = [f"fc_lstm_state ({kind}, {d}) [fc_lstm_state-{run}]" for d in ("rs", "bs")
          for kind, run in [("XE", "xe"), ("SLL", "sll"), ("SLL-ME", "sll_me"), ("SLL-SLE", "sll_sle")]]
    assert labels(table)[:8] == fc
    assert labels(table)[8] == "topdown (XE*, rs) [topdown-xe]" and len(labels(table)) == 16 + 3
    cells = rows(table)
    assert texts(cells["fc_lstm_state (SLL-SLE, rs) [fc_lstm_state-sll_sle]"]) == [
        "116.0 (paper 115.9, +0.1)", "0.30 (paper 0.29, +0.01)", "0.40 (paper 0.40, +0.00)",
        "0.66 (paper 0.68, -0.03)", "0.70"]  # Self-CIDEr: no paper number
    assert texts(cells["fc_lstm_state (XE, bs) [fc_lstm_state-xe]"]) == [
        "110.0 (paper 102.5, +7.5)", "0.27 (paper 0.27, +0.00)", "0.36 (paper 0.35, +0.01)",
        "0.76 (paper 0.80, -0.04)", "0.52"]
    sll_me_bs = cells["fc_lstm_state (SLL-ME, bs) [fc_lstm_state-sll_me]"]
    assert [c.paper for c in sll_me_bs] == [115.6, 0.26, 0.34, 0.79, None]
    assert all(c.paper is None for c in cells["topdown (SLL-SLE*, rs) [topdown-sll_sle]"])  # paper: no attention
    assert texts(cells["topdown (SLL-SLE*, rs) [topdown-sll_sle]"]) == ["102.0", "0.31", "0.42", "0.61", "0.71"]
    assert texts(cells["VAE [33] (bs) [paper]"]) == ["— (paper 100.0)", "—", "—", "—", "—"]
    assert texts(cells["GAN [26] (rs) [paper]"]) == ["—", "— (paper 0.41)", "— (paper 0.55)", "— (paper 0.51)", "—"]
    assert texts(cells["GAN [26] (bs) [paper]"])[1:] == ["— (paper 0.34)", "— (paper 0.44)", "— (paper 0.70)", "—"]
    assert "rs: 5 random samples, bs: top 5 beams" in table.title


@pytest.mark.parametrize("dataset", ["tgif", "synthetic", "synthetic_video"])
def test_table4_has_no_paper_numbers_elsewhere(dataset: str) -> None:
    params = sle_params()
    table = sle_table4(params, dataset, all_scores(params, dataset))
    assert all(c.paper is None for _, cs in table.rows for c in cs)
    assert not any("[paper]" in label for label in labels(table))
    assert any("paper numbers are shown on coco" in n and "MSCOCO" in n for n in table.notes)


def test_table4_without_diversity_says_not_evaluated() -> None:
    params = sle_params()
    scores = all_scores(params, "coco")
    # scored before the section existed
    scores["fc_lstm_state-sll"] = score(params, "fc_lstm_state-sll", "coco", with_diversity=False)
    scores["fc_lstm_state-xe"]["diversity"].pop("bs")
    cells = rows(sle_table4(params, "coco", scores))
    for d in ("rs", "bs"):
        row = cells[f"fc_lstm_state (SLL, {d}) [fc_lstm_state-sll]"]
        assert all(c.ours is None for c in row)
        assert [t.split(" (paper")[0] for t in texts(row)] == ["not evaluated"] * 5
    assert texts(cells["fc_lstm_state (XE, bs) [fc_lstm_state-xe]"])[0] == "not evaluated (paper 102.5)"
    assert cells["fc_lstm_state (XE, rs) [fc_lstm_state-xe]"][0].ours == pytest.approx(102.0)
    t2 = rows(sle_table2(params, "coco", scores))
    assert t2["fc_lstm_state (SLL) [fc_lstm_state-sll]"][1].ours == pytest.approx(115.0)


def test_table4_bs_cider_is_the_top_beams() -> None:
    """Paper 002's bs CIDEr equal its Table 2 (the top beam's), its rs CIDEr the mean over the 5
    samples (sec. 5.4). A score file whose bs section holds the mean over the beams (written
    before ``settings.precision``) shows the run's beam-5 test CIDEr-D instead (the same beam
    search: the same top beam); with another width, "not evaluated"; a note says which."""
    params = sle_params()
    scores = all_scores(params, "coco")
    for run in ("fc_lstm_state-sll", "fc_lstm_state-sll_me"):
        scores[run]["diversity"]["settings"].pop("precision")  # an older score file: bs = the mean
    scores["fc_lstm_state-sll_me"]["beam_size"] = 3  # its main score is not a beam-5 search
    table = sle_table4(params, "coco", scores)
    cells = rows(table)
    # its top-beam value
    assert texts(cells["fc_lstm_state (SLL-SLE, bs) [fc_lstm_state-sll_sle]"])[0] == "110.0 (paper 117.2, -7.2)"
    # metrics CIDEr-D, not 110.0
    assert texts(cells["fc_lstm_state (SLL, bs) [fc_lstm_state-sll]"])[0] == "115.0 (paper 115.0, +0.0)"
    # rs: the mean, as written
    assert cells["fc_lstm_state (SLL, rs) [fc_lstm_state-sll]"][0].ours == pytest.approx(102.0)
    assert texts(cells["fc_lstm_state (SLL-ME, bs) [fc_lstm_state-sll_me]"])[0] == "not evaluated (paper 115.6)"
    assert texts(cells["fc_lstm_state (SLL-ME, bs) [fc_lstm_state-sll_me]"])[1:] == [
        "0.27 (paper 0.26, +0.01)", "0.36 (paper 0.34, +0.02)", "0.76 (paper 0.79, -0.03)", "0.52"]
    assert ("fc_lstm_state-sll: its bs CIDEr-D is its beam-5 test CIDEr-D, the top beam's (its older diversity section "
            "holds the mean over the captions).") in table.notes
    assert ("fc_lstm_state-sll_me: bs CIDEr-D not evaluated: its diversity section holds the mean over the captions, "
            "not the top beam's (re-run its evaluation).") in table.notes
    assert "bs = the top beam's" in table.notes[0] and "rs = the mean over an image's 5 samples" in table.notes[0]


def test_table4_notes_other_diversity_settings() -> None:
    params = sle_params()
    scores = all_scores(params, "synthetic")
    scores["fc_lstm_state-sll"]["diversity"]["settings"]["samples"] = 3
    notes = sle_table4(params, "synthetic", scores).notes
    assert "fc_lstm_state-sll: diversity evaluated with samples = 3 (params: samples = 5)." in notes


# ---------------------------------------------------------------- Fig. 2 / 4


def test_samples_side_by_side_for_the_same_images() -> None:
    params = sle_params()
    scores = all_scores(params, "coco")
    # the first run's ids, in its order
    scores["fc_lstm_state-xe"]["diversity"] = diversity("fc_lstm_state-xe", ids=[7, 3, 9])
    table = sle_samples(params, "coco", scores)
    assert table.columns == ["XE", "SLL", "SLL-SLE", "references"]
    cells = rows(table)
    fc = [label for label in labels(table) if label.startswith("fc_lstm_state,")]
    assert fc == [f"fc_lstm_state, image {i}, {k}" for i in (7, 3, 9) for k in range(1, 6)]
    for i in (7, 3):
        for k in range(5):
            assert texts(cells[f"fc_lstm_state, image {i}, {k + 1}"]) == [f"fc_lstm_state-xe sample {k} of image {i}",
                                                               f"fc_lstm_state-sll sample {k} of image {i}",
                                                               f"fc_lstm_state-sll_sle sample {k} of image {i}",
                                                               f"reference {k} of image {i}"]
    assert texts(cells["fc_lstm_state, image 9, 1"]) == ["fc_lstm_state-xe sample 0 of image 9", "—", "—",
                                                         "reference 0 of image 9"]
    assert "fc_lstm_state-sll: no example for image 9." in table.notes
    assert texts(cells["topdown, image 3, 2"])[:3] == ["topdown-xe sample 1 of image 3",
                                                       "topdown-sll sample 1 of image 3",
                                                       "topdown-sll_sle sample 1 of image 3"]
    assert "ids from fc_lstm_state-xe" in table.notes[0]


def test_samples_missing_or_unevaluated_runs() -> None:
    params = sle_params()
    scores = all_scores(params, "synthetic")
    del scores["fc_lstm_state-xe"]
    scores["fc_lstm_state-sll"] = score(params, "fc_lstm_state-sll", "synthetic", with_diversity=False)
    for run in ("topdown-xe", "topdown-sll", "topdown-sll_sle"):
        del scores[run]
    table = sle_samples(params, "synthetic", scores)
    cells = rows(table)
    assert texts(cells["fc_lstm_state, image 3, 1"]) == ["—", "not evaluated",
                                                         "fc_lstm_state-sll_sle sample 0 of image 3",
                                              "reference 0 of image 3"]
    assert texts(cells["topdown: no examples"]) == ["—", "—", "—", "—"]
    assert "ids from fc_lstm_state-sll_sle" in table.notes[0]


# ---------------------------------------------------------------- renderings


@pytest.mark.parametrize("dataset", ["coco", "tgif", "synthetic", "synthetic_video"])
def test_every_rendering(dataset: str) -> None:
    params = sle_params()
    scores = all_scores(params, dataset)
    scores["fc_lstm_state-sll_me"].pop("diversity")
    scores["topdown-sll"]["diversity"]["examples"][0]["rs"][0] = "a 50% cut & paste_caption #1"
    for build in (sle_table2, sle_table3, sle_table4, sle_samples):
        table = build(params, dataset, scores)
        md, csv, tex = table.markdown(), table.csv(), table.latex()
        assert md.startswith(f"### {dataset} test split: SLE (Chen & Jin, CVPR 2020)")
        assert all(line.count("|") == len(table.columns) + 2 for line in md.splitlines() if line.startswith("| "))
        assert len(csv.splitlines()) == len(table.rows) + 1 and "\\end{tabular}" in tex
    samples = sle_samples(params, dataset, scores)
    assert "fc_lstm_state-sll_sle sample 4 of image 7" in samples.csv()
    assert ("| fc_lstm_state, image 3, 1 | fc_lstm_state-xe sample 0 of image 3 | fc_lstm_state-sll sample 0 of "
            "image 3 |") in samples.markdown()
    assert "a 50\\% cut \\& paste\\_caption \\#1" in samples.latex()
    t4 = sle_table4(params, dataset, scores)
    assert "| fc_lstm_state (SLL-ME, rs) [fc_lstm_state-sll_me] | not evaluated" in t4.markdown()
    csv_row = next(line for line in t4.csv().splitlines() if line.startswith('"fc_lstm_state (SLL-SLE, rs)'))
    assert csv_row.startswith('"fc_lstm_state (SLL-SLE, rs) [fc_lstm_state-sll_sle]",102.0000,')
    assert ",0.3100," in csv_row


# ---------------------------------------------------------------- the paper's numbers


def test_table1_repeats_table4_rs_rows() -> None:
    assert paper.TABLE1 == {kind: paper.TABLE4[kind, "rs"] for kind in ("xe", "sll")}
    for kind in ("sll", "sll_me", "sll_sle"):  # Table 4 (bs) is Table 2's model without attention
        assert paper.TABLE4[kind, "bs"]["C"] == paper.TABLE2[False][kind]["C"]


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason="the paper's text is not beside the repository")
def test_numbers_as_printed_in_the_paper() -> None:
    """Every typed number against the paper's tab-separated table lines, in the paper's order."""
    lines = [line.split("\t") for line in PAPER_TEXT.read_text().splitlines() if "\t" in line]

    def values(cells: list[str]) -> list[float | None]:
        return [None if c.strip() == "NA" else float(re.sub(r"<[^>]+>", "", c)) for c in cells]

    printed = [(c[0].strip(), values(c[1:])) for c in lines
               if len(c) in (4, 5) and re.fullmatch(r"[\d.]+|NA|<b>[\d.]+</b>", c[1].strip())]
    mcs, t4 = ["M", "C", "S"], ["C", "Div-1", "Div-2", "mBLEU-4"]
    labels2 = {"sll": "SLL", "sll_me": "SLL-ME", "sll_sle": "SLL-SLE"}
    typed = [(label, [row.get(k) for k in mcs]) for label, row in paper.TABLE2_PRIOR]
    typed += [(labels2[k] + star + (" (ours)" if k == "sll_sle" else ""), [paper.TABLE2[att][k].get(c) for c in mcs])
              for att, star in [(False, ""), (True, "*")] for k in labels2]
    typed += [(label, [row.get(k) for k in mcs]) for label, row in paper.TABLE3_PRIOR]
    typed += [(labels2[k] + (" (ours)" if k == "sll_sle" else ""), [paper.TABLE3[False][k].get(c) for c in mcs])
              for k in labels2]
    typed += [(f"{({'xe': 'XE'} | labels2)[k]} ({d})", [paper.TABLE4[k, d].get(c) for c in t4])
              for d in ("rs", "bs") for k in ("xe", "sll", "sll_me", "sll_sle")]
    typed += [(label, [row.get(k) for k in t4]) for label, row in paper.TABLE4_REFERENCE]

    def norm(label: str) -> str:
        return label.replace(" ", "")

    assert [(norm(label), v) for label, v in printed] == [(norm(label), v) for label, v in typed]
