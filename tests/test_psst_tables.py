"""Paper 004 (PSST): operating points on curves, Tables 1, 2, 3, 6, the points table and Figs. 3-4."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from caprl import cli, params as params_mod
from caprl.errors import CaprlError
from caprl.figures import discriminative as figs
from caprl.tables import psst_numbers as paper
from caprl.tables.build import TABLES, load_scores
from caprl.tables.operating import family_points, family_runs, interpolate, overlap_value, rho_curves
from caprl.tables.psst import psst_points, psst_table1, psst_table2, psst_table3, psst_table6
from caprl.tables.render import Cell, Table
from conftest import REPO, default_params

PAPER_TEXT = REPO.parent / "shared" / "papers" / "004_25b590cd57fb3474.txt"
SPICE_REASON = "java not found on PATH"
LAMS = [0.001, 0.005, 0.01]
RHOS = [0.25, 0.5]
#: method -> (R@5, CIDEr-D) of its runs in ascending λ (ρ = 0.25 for PSST; ρ = 0.5: R@5 - 0.05)
CURVES: dict[str, list[tuple[float, float]]] = {
    "luo2018": [(0.40, 1.25), (0.45, 1.15), (0.50, 1.05)],
    "reinforce_joint": [(0.70, 1.30), (0.78, 1.20), (0.86, 1.00)],
    "st_gumbel": [(0.72, 1.30), (0.80, 1.22), (0.88, 1.10)],
    "st_multinomial": [(0.74, 1.30), (0.82, 1.25), (0.90, 1.10)],
    "psst_gumbel": [(0.76, 1.32), (0.84, 1.26), (0.92, 1.12)],
    "psst_multinomial": [(0.78, 1.35), (0.86, 1.28), (0.94, 1.15)],
}
FROZEN = {"frozen-a": ("luo2018", 0.60, 1.13), "frozen-b": ("xe", 0.30, 1.02)}  # init method, R@5, CIDEr-D


# ---------------------------------------------------------------- interpolation


def test_interpolate_on_a_monotone_curve() -> None:
    c = [(0.70, 1.30), (0.78, 1.20), (0.86, 1.00)]
    assert interpolate(c, 0.80) == pytest.approx(1.15)
    assert interpolate(c, 0.74) == pytest.approx(1.25)
    assert interpolate(c, 0.78) == 1.20 and interpolate(c, 0.70) == 1.30 and interpolate(c, 0.86) == 1.00
    assert interpolate(c, 0.69) is None and interpolate(c, 0.87) is None
    assert interpolate(list(reversed(c)), 0.80) == pytest.approx(1.15)  # either λ order


def test_interpolate_takes_the_first_segment_of_a_non_monotone_curve() -> None:
    c = [(0.0, 0.0), (2.0, 2.0), (1.0, 10.0)]  # x goes up, then back
    assert interpolate(c, 1.5) == pytest.approx(1.5)  # first segment, not the second (6.0)
    assert interpolate(c, 2.0) == 2.0
    c2 = [(3.0, 1.0), (1.0, 3.0), (2.0, 5.0)]
    assert interpolate(c2, 1.5) == pytest.approx(2.5)
    assert interpolate([(1.0, 1.0), (1.0, 7.0), (2.0, 9.0)], 1.0) == 1.0  # vertical segment: its first point
    assert interpolate([(1.0, 1.0), (1.0, 7.0), (2.0, 9.0)], 1.5) == pytest.approx(8.0)


def test_interpolate_single_point_and_empty() -> None:
    assert interpolate([(0.5, 3.0)], 0.5) == 3.0
    assert interpolate([(0.5, 3.0)], 0.6) is None
    assert interpolate([], 0.5) is None


def test_overlap_value() -> None:
    assert overlap_value([[(0.7, 0), (0.9, 0)], [(0.6, 0), (0.85, 0)], [(0.8, 0), (0.95, 0), (0.75, 0)]]) == 0.85
    # no common overlap: the highest value the most curves reach (two of three here)
    assert overlap_value([[(0.1, 0), (0.5, 0)], [(0.6, 0), (0.9, 0)], [(0.7, 0), (0.8, 0)]]) == 0.8
    assert overlap_value([[(0.5, 0), (0.9, 0)], [(0.7, 0)]]) == 0.7  # a single point inside the other range
    assert overlap_value([[(0.5, 0), (0.9, 0)], []]) == 0.9  # an empty curve is left out
    assert overlap_value([]) is None


# ---------------------------------------------------------------- hand-made params and results


def family_params() -> dict[str, Any]:
    """Every method at 3 λ (PSST at 2 ρ), two frozen speakers, an xe and a listener run. Run names
    are meaningless on purpose (runs are found by method, options and init)."""
    methods = list(CURVES)
    objectives: dict[str, Any] = {m: {"lam": 0.005, **({"rho": 0.25} if m.startswith("psst") else {})}
                                  for m in methods}
    objectives.update({"frozen_speaker": {"epochs": 1}, "xe": {"epochs": 1}, "listener": {"epochs": 1}})
    runs: dict[str, Any] = {"speaker": {"method": "xe", "model": "fc"},
                            "pretrain": {"method": "listener", "model": "fc"}}
    for method in methods:
        for rho in RHOS if method.startswith("psst") else [None]:
            for lam in LAMS:
                options = {"lam": lam, **({"rho": rho} if rho is not None else {})}
                runs[f"x{len(runs):02d}"] = {"method": method, "model": "fc", "options": options,
                                             "decode": {"beam_size": 2}}
    luo = next(r for r, e in runs.items() if e["method"] == "luo2018" and e["options"]["lam"] == 0.01)
    runs["frozen-a"] = {"method": "frozen_speaker", "model": "fc", "init": {"model": luo}, "decode": {"beam_size": 2}}
    runs["frozen-b"] = {"method": "frozen_speaker", "model": "fc", "init": {"model": "speaker"},
                        "decode": {"beam_size": 2}}
    return {"datasets": {name: {"enabled": True} for name in ("synthetic", "coco", "flickr30k")},
            "evaluate": {"split": "test", "greedy": False, "diversity": {"methods": [], "samples": 5, "beams": 5, "examples": 2}}, "decode": {"method": "beam", "beam_size": 5, "max_length": 16},
            "models": {"fc": {"arch": "fc"}}, "objectives": objectives, "runs": runs,
            "discriminative": {"table_rho": 0.25, "operating_points": {
                "coco": {"recall5": 0.80, "cider": 1.2, "ablation_cider": 1.13, "rho_cider": 1.22}}}}


def report(run: str, dataset: str, r5: float, cider: float) -> dict[str, Any]:
    return {"run": run, "dataset": dataset, "split": "test",
            "metrics": {"CIDEr-D": cider, "BLEU-4": cider / 4, "METEOR": 0.25, "ROUGE-L": 0.5},
            "unavailable": {"SPICE": SPICE_REASON},
            "retrieval": {"run": run, "dataset": dataset, "R@1": r5 - 0.3, "R@5": r5, "R@10": r5 + 0.1,
                          "mean_rank": 10 * (1 - r5), "median_rank": 3.0, "n_images": 100}}


def family_scores(params: dict[str, Any], dataset: str) -> dict[str, Any]:
    out = {}
    for run, entry in params["runs"].items():
        if entry["method"] in CURVES:
            k = LAMS.index(entry["options"]["lam"])
            r5, cider = CURVES[entry["method"]][k]
            out[run] = report(run, dataset, r5 - (0.05 if entry["options"].get("rho") == 0.5 else 0.0), cider)
        elif run in FROZEN:
            out[run] = report(run, dataset, FROZEN[run][1], FROZEN[run][2])
    return out


def rows(table: Table) -> dict[str, list[Cell]]:
    return dict(table.rows)


def ours(cells: list[Cell]) -> list[float | None]:
    return [c.ours for c in cells]


# ---------------------------------------------------------------- tables


def test_tables_are_registered() -> None:
    assert {"psst_table1", "psst_table2", "psst_table3", "psst_table6", "psst_points"} <= set(TABLES)


def test_runs_are_found_by_method_options_and_init() -> None:
    params = family_params()
    points = family_points(params, "coco", family_scores(params, "coco"))
    assert len(points) == 4 * 3 + 2 * 2 * 3 + 2  # the xe and listener runs are not part of the family
    frozen = {p.spec.name: p.init_method for p in points if p.method == "frozen_speaker"}
    assert frozen == {"frozen-a": "luo2018", "frozen-b": "xe"}


def test_table1_interpolates_at_the_fixed_recall_with_paper_numbers_on_coco() -> None:
    params = family_params()
    table = psst_table1(params, "coco", family_scores(params, "coco"))
    got = rows(table)
    assert list(got) == ["Luo et al. 2018", "REINFORCE", "ST Gumbel Softmax", "ST Multinomial",
                         "PSST Gumbel Softmax", "PSST Multinomial"]
    assert ours(got["REINFORCE"])[:4] == pytest.approx([1.15, 1.15 / 4, 0.25, 0.5])
    assert got["ST Gumbel Softmax"][0].ours == pytest.approx(1.22)  # an exact hit on a run
    assert got["ST Multinomial"][0].ours == pytest.approx(1.2625)
    assert got["PSST Gumbel Softmax"][0].ours == pytest.approx(1.29)  # ρ = 0.25 runs only
    assert got["PSST Multinomial"][0].ours == pytest.approx(1.3325)
    assert [c.text() for c in got["Luo et al. 2018"]] == ["—"] * 5  # its R@5 never reaches 80%
    assert got["REINFORCE"][4].ours is None  # SPICE not computed
    assert [c.paper for c in got["PSST Multinomial"]] == [1.119, 0.322, 0.264, 0.544, 0.206]
    assert got["REINFORCE"][0].text() == "1.150 (paper 0.902, +0.248)"
    assert "80.0%" in table.title and "the paper's value" in table.title and "beam 2" in table.title
    notes = " ".join(table.notes)
    assert "Luo et al. 2018: its runs' R@5 spans 40.0%–50.0%, not 80.0%." in notes
    assert "SPICE: not computed (java not found on PATH)." in table.notes
    table.markdown(), table.csv(), table.latex()


def test_table6_on_flickr30k_only_and_auto_operating_point() -> None:
    params = family_params()
    for run in [r for r, e in params["runs"].items() if e["method"] == "luo2018"]:
        params["runs"][run]["datasets"] = ["coco"]
    scores = family_scores(params, "flickr30k")
    t6 = psst_table6(params, "flickr30k", scores)
    assert "auto" in t6.title and "86.0%" in t6.title  # the highest R@5 every curve reaches (REINFORCE's)
    got = rows(t6)
    assert got["PSST Multinomial"][0].ours == pytest.approx(1.28) and got["REINFORCE"][0].ours == pytest.approx(1.00)
    assert got["PSST Multinomial"][0].paper == 0.488
    assert paper.TABLE6_LUO_NOTE in t6.notes and any("no luo2018 run" in n for n in t6.notes)
    t1 = psst_table1(params, "flickr30k", scores)  # Table 1's numbers are COCO's
    assert all(c.paper is None for _, cells in t1.rows for c in cells)
    t6_coco = psst_table6(params, "coco", family_scores(params, "coco"))
    assert all(c.paper is None for _, cells in t6_coco.rows for c in cells)


def test_without_a_common_overlap_auto_takes_the_value_most_curves_reach() -> None:
    params = family_params()  # synthetic: auto; Luo's R@5 range (0.40-0.50) does not meet the others'
    table = psst_table1(params, "synthetic", family_scores(params, "synthetic"))
    assert "R@5 = 86.0% (auto: the highest value the most compared curves reach)" in table.title
    got = rows(table)
    assert all(c.text() == "—" for c in got.get("Luo et al. 2018", []))
    assert ours(got["PSST Multinomial"])[0] == pytest.approx(1.28)  # its λ = 0.005 run has R@5 0.86
    assert all(c.paper is None for _, cells in table.rows for c in cells)


def test_table2_recall_at_fixed_cider() -> None:
    params = family_params()
    table = psst_table2(params, "coco", family_scores(params, "coco"))
    got = rows(table)
    assert ours(got["REINFORCE"]) == pytest.approx([48.0, 78.0, 88.0])  # the λ = 0.005 run: CIDEr-D 1.20
    assert ours(got["Luo et al. 2018"]) == pytest.approx([12.5, 42.5, 52.5])
    assert ours(got["PSST Multinomial"]) == pytest.approx([100 * (0.86 + 0.08 * 8 / 13) - 30,
                                                          100 * (0.86 + 0.08 * 8 / 13),
                                                          100 * (0.86 + 0.08 * 8 / 13) + 10])
    assert [c.paper for c in got["Luo et al. 2018"]] == [16.1, 41.5, 55.8]
    assert "CIDEr-D = 1.200" in table.title


def test_table3_ablations() -> None:
    params = family_params()
    scores = family_scores(params, "coco")
    table = psst_table3(params, "coco", scores)
    got = rows(table)
    assert list(got) == ["Luo et al. 2018", "Frozen Speaker (Luo)", "Frozen Speaker (MLE)", "REINFORCE"]
    assert ours(got["Luo et al. 2018"]) == pytest.approx([1.13, 16.0, 46.0, 56.0])
    assert ours(got["Frozen Speaker (Luo)"]) == pytest.approx([1.13, 30.0, 60.0, 70.0])
    assert ours(got["Frozen Speaker (MLE)"]) == pytest.approx([1.02, 0.0, 30.0, 40.0])  # its own point
    assert ours(got["REINFORCE"]) == pytest.approx([1.13, 50.8, 80.8, 90.8])  # on its last segment
    assert [c.paper for c in got["Frozen Speaker (MLE)"]] == [1.13, 19.3, 46.9, 61.3]
    assert "params.yaml discriminative.operating_points.coco.ablation_cider, the paper's value" in table.title
    del params["discriminative"]["operating_points"]["coco"]["ablation_cider"]  # auto: the Frozen (Luo) run's
    assert "1.130 (auto" in psst_table3(params, "coco", scores).title
    del params["runs"]["frozen-a"]  # auto: the overlap of the Luo and REINFORCE curves' CIDEr-D (1.05-1.25)
    got = rows(psst_table3(params, "coco", scores))
    assert ours(got["Luo et al. 2018"])[:3] == pytest.approx([1.25, 10.0, 40.0])
    assert ours(got["REINFORCE"])[2] == pytest.approx(74.0)
    assert list(got) == ["Luo et al. 2018", "Frozen Speaker (MLE)", "REINFORCE"]
    params["runs"]["frozen-c"] = {**params["runs"]["frozen-b"], "init": {"model": "speaker2"}}  # two MLE kind rows
    params["runs"]["speaker2"] = {"method": "xe", "model": "fc"}
    labels = [label for label, _ in psst_table3(params, "coco", scores).rows]
    assert labels[1:3] == ["Frozen Speaker (MLE) [init speaker]", "Frozen Speaker (MLE) [init speaker2]"]
    params["runs"]["frozen-c"]["init"] = {"model": "speaker"}  # and of one init run: the run too
    labels = [label for label, _ in psst_table3(params, "coco", scores).rows]
    assert labels[1:3] == ["Frozen Speaker (MLE) [init speaker, run frozen-b]",
                           "Frozen Speaker (MLE) [init speaker, run frozen-c]"]


def test_points_table_lists_every_run() -> None:
    params = family_params()
    table = psst_points(params, "coco", family_scores(params, "coco"))
    assert len(table.rows) == 4 * 3 + 2 * 2 * 3 + 2
    first = table.rows[0]
    assert first[0].startswith("Luo et al. 2018 [") and first[1][0].text() == "0.001" and first[1][1].text() == "—"
    psst = [cells for label, cells in table.rows if label.startswith("PSST Multinomial")]
    assert [(c[0].text(), c[1].text()) for c in psst] == [(lam, rho) for rho in ("0.25", "0.5")
                                                         for lam in ("0.001", "0.005", "0.01")]
    frozen = rows(table)["Frozen Speaker (MLE) [frozen-b]"]
    assert frozen[2].ours == pytest.approx(1.02) and frozen[8].ours == pytest.approx(30.0)
    assert table.columns == ["λ", "ρ", "CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L", "SPICE", "R@1", "R@5", "R@10",
                             "mean rank"]


def test_missing_results_show_a_dash_and_say_which_runs() -> None:
    params = family_params()
    scores = family_scores(params, "coco")
    psst = [r for r, e in params["runs"].items() if e["method"] == "psst_gumbel"]
    for run in psst:
        del scores[run]["retrieval"]
    got = rows(psst_table1(params, "coco", scores))
    assert [c.text() for c in got["PSST Gumbel Softmax"]][0] == "— (paper 1.109)"
    notes = " ".join(psst_table1(params, "coco", scores).notes)
    assert "PSST Gumbel Softmax: 3 of 3 runs lack scores or retrieval results" in notes


def gold_report(run: str, dataset: str) -> dict[str, Any]:
    """``caprl retrieval --gold`` of a listener run: its listener ranking by the first gold captions."""
    return {"run": run, "dataset": dataset, "split": "test", "listener": "the run's own", "captions": "gold",
            "R@1": 0.6, "R@5": 0.9, "R@10": 0.95, "mean_rank": 1.5, "median_rank": 1.0, "n_images": 100}


GOLD_NOTE = ("Listener pretrain, the first gold caption of each of the 100 test images: R@1 60.0%, R@5 90.0%, "
             "R@10 95.0% (an upper reference for the captions' recall).")


def test_the_listener_runs_gold_caption_recall_is_a_note_and_a_points_row() -> None:
    """The `listener` run (named `pretrain` here) has no scores, only its gold-caption retrieval."""
    params = family_params()
    scores = family_scores(params, "coco")
    scores["pretrain"] = {"run": "pretrain", "dataset": "coco", "retrieval": gold_report("pretrain", "coco")}
    for build in (psst_table2, psst_table3, psst_points):
        assert GOLD_NOTE in build(params, "coco", scores).notes, build.__name__
    points = psst_points(params, "coco", scores)
    assert len(points.rows) == 4 * 3 + 2 * 2 * 3 + 2 + 1
    label, cells = points.rows[-1]
    assert label == "Listener, first gold caption [pretrain]"
    assert [c.text() for c in cells[:7]] == ["—"] * 7 and ours(cells[7:]) == pytest.approx([60.0, 90.0, 95.0, 1.5])
    assert ours(rows(psst_table2(params, "coco", scores))["REINFORCE"]) == pytest.approx([48.0, 78.0, 88.0])

    del scores["pretrain"]  # no retrieval.json: the note says so, no row
    missing = ("Listener pretrain: no recall of the first gold captions of the test images (its retrieval.json, "
               "`caprl retrieval --gold`, is missing).")
    for build in (psst_table2, psst_table3, psst_points):
        assert missing in build(params, "coco", scores).notes, build.__name__
    assert len(psst_points(params, "coco", scores).rows) == 4 * 3 + 2 * 2 * 3 + 2
    del params["runs"]["pretrain"]  # no listener run: no note
    assert not any(n.startswith("Listener ") for n in psst_table2(params, "coco", scores).notes)


def test_missing_discriminative_section_is_an_error() -> None:
    params = family_params()
    del params["discriminative"]
    with pytest.raises(CaprlError, match="discriminative"):
        psst_table1(params, "coco", {})
    params = family_params()
    params["discriminative"]["operating_points"]["coco"]["cider"] = "high"
    with pytest.raises(CaprlError, match="discriminative.operating_points.coco.cider"):
        psst_table2(params, "coco", {})


# ---------------------------------------------------------------- score files on disk


def test_load_scores_attaches_the_retrieval_report(tmp_path: Path) -> None:
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        full = report(run, "coco", 0.8, 1.2)
        retrieval = full.pop("retrieval")
        (tmp_path / run / "scores.json").write_text(json.dumps(full))
        if run == "a":
            (tmp_path / run / "retrieval.json").write_text(json.dumps({**retrieval, "ranks": {"1": 2}}))
    scores = load_scores(tmp_path, ["a", "b"], "coco")
    assert scores["a"]["retrieval"]["R@5"] == 0.8 and "retrieval" not in scores["b"]
    (tmp_path / "b" / "retrieval.json").write_text(json.dumps({"run": "a", "R@10": 0.5}))
    with pytest.raises(CaprlError, match="retrieval results of run 'a', not of 'b'"):
        load_scores(tmp_path, ["b"], "coco")
    (tmp_path / "b" / "retrieval.json").write_text(json.dumps({"run": "b", "dataset": "f", "R@10": 0.5}))
    with pytest.raises(CaprlError, match="not of --dataset coco"):
        load_scores(tmp_path, ["b"], "coco")


def test_load_scores_reads_the_listener_runs_gold_retrieval(tmp_path: Path) -> None:
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "retrieval.json").write_text(json.dumps(gold_report("pretrain", "coco")))
    scores = load_scores(tmp_path, [], "coco", gold=["pretrain", "other"])  # `other`: no file, left out
    assert scores == {"pretrain": {"run": "pretrain", "dataset": "coco", "retrieval": gold_report("pretrain", "coco")}}
    with pytest.raises(CaprlError, match=r"retrieval by the gold captions, but run 'pretrain' is ranked by its "
                                         r"generated captions \(caprl retrieval --captions\)"):
        (tmp_path / "pretrain" / "scores.json").write_text(json.dumps(report("pretrain", "coco", 0.8, 1.2)))
        load_scores(tmp_path, ["pretrain"], "coco")  # a captioner run's retrieval.json must be of its captions
    generated = {**gold_report("pretrain", "coco"), "captions": "generated"}
    (tmp_path / "pretrain" / "retrieval.json").write_text(json.dumps(generated))
    with pytest.raises(CaprlError, match=r"by the generated captions, but run 'pretrain' is ranked by its gold"):
        load_scores(tmp_path, [], "coco", gold=["pretrain"])


# ---------------------------------------------------------------- figures


def test_figures_are_written(tmp_path: Path) -> None:
    params = family_params()
    paths = figs.draw(params, "coco", family_scores(params, "coco"), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["psst_fig3.png", "psst_fig4.png"]
    for path in paths:
        with Image.open(path) as png:
            assert png.format == "PNG" and png.width > 300 and png.height > 200
    fig3 = figs.fig3(params, "coco", family_scores(params, "coco"))
    spice = [ax for ax in fig3.axes if ax.get_title() == "SPICE"][0]
    assert [t.get_text().replace("\n", " ") for t in spice.texts] == [f"SPICE not computed: {SPICE_REASON}"]
    cider = [ax for ax in fig3.axes if ax.get_title() == "CIDEr-D"][0]
    assert len(cider.lines) == 6 + 2  # one line per method, one marker per frozen speaker
    figs.draw(copy.deepcopy(params), "synthetic", {}, tmp_path / "empty")  # no results: says so, still drawn


def test_fig4_takes_rho_zero_from_the_st_method() -> None:
    params = family_params()
    scores = family_scores(params, "coco")
    points = [p for p in family_points(params, "coco", scores) if p.complete]
    curves, borrowed = rho_curves(points, "psst_multinomial", "fc")
    assert borrowed and list(curves) == [0.0, 0.25, 0.5]
    st_multinomial = [(1.30, 0.84), (1.25, 0.92), (1.10, 1.00)]  # its (CIDEr-D, R@10) in λ order
    assert curves[0.0] == [pytest.approx(xy) for xy in st_multinomial]
    fig = figs.fig4(params, "coco", scores)
    ax = fig.axes[0]
    line = [ln for ln in ax.lines if ln.get_label() == "PSST Multinomial"][0]
    assert list(line.get_xdata()) == [0.0, 0.25, 0.5]
    assert "CIDEr-D = 1.22 (the paper's value)" in ax.get_title()
    assert any("ST = PSST with ρ = 0" in t.get_text() for t in fig.texts)


def test_stages_read_score_and_retrieval_files(tmp_path: Path) -> None:
    """``caprl psst-figures`` and ``caprl tables`` on the repository's params.yaml and files on disk."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(json.dumps(default_params()))
    params = params_mod.load(params_file)
    results, out = tmp_path / "results" / "synthetic", tmp_path / "out"
    specs = family_runs(params, "synthetic")
    for spec in specs:
        lam = float(spec.options.get("lam") or 0.0)
        full = report(spec.name, "synthetic", min(0.99, 0.5 + lam), 1.3 - lam)
        (results / spec.name).mkdir(parents=True)
        (results / spec.name / "retrieval.json").write_text(json.dumps(full.pop("retrieval")))
        (results / spec.name / "scores.json").write_text(json.dumps(full))
    common = ["--params", str(params_file), "--dataset", "synthetic", "--results-dir", str(results), "--out-dir"]
    assert cli.main(["psst-figures", *common, str(out / "figures")]) == 0
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["psst_fig3.png", "psst_fig4.png"]
    if "psst_points" in params_mod.dataset_tables(params, "synthetic"):
        assert cli.main(["tables", *common, str(out / "tables"), "--table", "psst_points"]) == 0
        text = (out / "tables" / "synthetic_psst_points.md").read_text()
        assert all(f"[{spec.name}] |" in text for spec in specs) and "| — | — | — |" not in text


# ---------------------------------------------------------------- the paper's numbers


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason="the paper's text is not beside the repository")
def test_numbers_as_printed_in_the_paper() -> None:
    """Every typed number, in the order the paper's text prints the tables (column blocks)."""
    text = PAPER_TEXT.read_text()

    def printed(start: str, end: str) -> list[float]:
        region = re.search(rf"^{re.escape(start)}\n(.*?)^{re.escape(end)}", text, re.S | re.M)
        assert region, start
        return [float(x) for x in re.findall(r"(?<![\w@=.])\d+\.\d+", region.group(1))]

    lang, recall = paper.LANGUAGE_KEYS.split(), paper.RECALL_KEYS.split()
    a, b = ["reinforce_joint", "st_gumbel", "st_multinomial"], ["psst_gumbel", "psst_multinomial"]

    def columns(table: dict[str, dict[str, float]], methods: list[str], keys: list[str]) -> list[float]:
        return [table[m][k] for k in keys for m in methods]

    def table1_block(methods: list[str]) -> list[float]:  # three columns, then ROUGE and SPICE row by row
        return columns(paper.TABLE1, methods, lang[:3]) + [paper.TABLE1[m][k] for m in methods for k in lang[3:]]

    assert printed("Recall@5=80%", "Table 1:") == table1_block(a) + table1_block(b)
    assert printed("CIDEr=1.2", "Table 2:") == columns(paper.TABLE2, list(paper.TABLE2), recall)
    assert printed("CIDEr=1.13", "Table 3:") == columns(paper.TABLE3, list(paper.TABLE3), recall)
    assert printed(" Recall@5=90%", "Table 6:") == columns(paper.TABLE6, a, lang) + columns(paper.TABLE6, b, lang)
    assert list(paper.TABLE2) == ["luo2018", "reinforce_joint", "st_gumbel", "st_multinomial", "psst_gumbel",
                                  "psst_multinomial"]
    assert "selecting CIDEr scores at 1.22" in text and "Recall@5=80%" in text and "CIDEr=1.13" in text


def test_rho_table_reads_every_rho_curve_at_the_fixed_cider() -> None:
    from caprl.tables.psst import psst_rho

    params = family_params()
    table = psst_rho(params, "coco", family_scores(params, "coco"))
    assert table.columns == ["ρ = 0", "ρ = 0.25", "ρ = 0.5"]
    t = (1.28 - 1.22) / (1.28 - 1.15)  # CIDEr-D 1.22 on the second segment of the ρ > 0 curves
    assert ours(rows(table)["PSST Multinomial"]) == pytest.approx(
        [100 * (0.92 + 0.08 * (1.25 - 1.22) / 0.15), 100 * (0.96 + 0.08 * t), 100 * (0.91 + 0.08 * t)])
    assert "CIDEr-D = 1.220" in table.title and any("ST = PSST with ρ = 0" in n for n in table.notes)
