"""self-critical.pytorch's MODEL_ZOO.md in caprl: the recipes configs/recipes/updown-coco.yaml and
transformer-coco.yaml, and the published numbers their main table shows (caprl.tables.published):
which run is compared with which MODEL_ZOO.md row, under which conditions none is, what the plan
refuses, and what `caprl plan` costs for them (the transformer has no hidden_size key)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from caprl import params as params_mod
from caprl.errors import CaprlError
from caprl.models import MODELS
from caprl.objectives import OBJECTIVES
from caprl.tables import published
from caprl.tables.build import METRICS, main_table
from caprl.tables.published import PUBLISHED, PublishedRow, PublishedSet
from caprl.workflow import costs, plan as wp
from conftest import REPO

RECIPES = ("updown-coco", "transformer-coco")
#: run -> (MODEL_ZOO.md row, its CIDEr, its SPICE), as MODEL_ZOO.md prints them (fractions x 100)
EXPECTED = {
    "topdown-xe": ("UpDown", 109.9, 19.99),
    "topdown-scst": ("UpDown+self_critical", 122.7, 21.45),
    "topdown-nsc": ("UpDown+new_self_critical", 123.9, 21.54),
    "transformer-xe": ("Transformer", 112.59, 20.63),
    "transformer-scst": ("Transformer+self_critical", 127.7, 22.49),
    "transformer-nsc": ("Transformer+new_self_critical", 130.3, 22.89),
}
OURS = {"BLEU-1": 0.76, "BLEU-2": 0.6, "BLEU-3": 0.46, "BLEU-4": 0.35, "METEOR": 0.27, "ROUGE-L": 0.56,
        "CIDEr-D": 1.25, "SPICE": 0.21}


@pytest.fixture(scope="module")
def loaded() -> dict[str, dict[str, Any]]:
    return {name: params_mod.load([REPO / "params.yaml", REPO / "configs" / "recipes" / f"{name}.yaml"])
            for name in RECIPES}


def scores_of(params: dict[str, Any]) -> dict[str, Any]:
    runs = params["datasets"]["coco"]["runs"]
    return {run: {"run": run, "dataset": "coco", "metrics": OURS} for run in runs}


def paper_columns(table: Any) -> dict[str, dict[str, float | None]]:
    """Row label -> column -> the paper number of its cell (None where it has none)."""
    return {label: {column: cell.paper for column, cell in zip(table.columns, cells)} for label, cells in table.rows}


def row_of(table: Any, run: str) -> str:
    return next(label for label, _ in table.rows if label.endswith(f"[{run}]"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_main_table_shows_model_zoo_numbers_beside_each_recipe_run(recipe: str, loaded: dict) -> None:
    params = loaded[recipe]
    assert params["datasets"]["coco"]["published"] == ["scp_model_zoo"]
    assert params_mod.dataset_tables(params, "coco") == ["main"]
    table = main_table(params, "coco", scores_of(params))
    papers = paper_columns(table)
    for run in params["datasets"]["coco"]["runs"]:
        label, cider, spice = EXPECTED[run]
        row = papers[row_of(table, run)]
        assert row["C"] == pytest.approx(cider) and row["S"] == pytest.approx(spice)
        assert all(value is None for column, value in row.items() if column not in ("C", "S"))
        assert f"{run} = {label} (configs/" in " ".join(table.notes)
    assert all(value is None for value in papers["most frequent training caption"].values())
    note = next(n for n in table.notes if n.startswith("(paper x, ±d): self-critical.pytorch MODEL_ZOO.md"))
    assert "Karpathy test split, beam 5" in note and "10-100 boxes" in note
    xe = params["datasets"]["coco"]["runs"][0]
    cider = EXPECTED[xe][1]
    text = dict(table.rows)[row_of(table, xe)][table.columns.index("C")].text()
    assert text == f"125.0 (paper {cider:.1f}, {round(125.0 - cider, 1):+.1f})"  # ours 1.25 CIDEr-D
    assert f"| {row_of(table, xe)} |" in table.markdown() and text in table.markdown()
    assert f"125.0000,{cider:.4f}," in table.csv()  # the C column, then its (paper) column


def _without(params: dict[str, Any], change: str) -> dict[str, Any]:
    """The updown recipe's params with one of a MODEL_ZOO.md row's conditions broken."""
    p = copy.deepcopy(params)
    if change == "backbone":
        p["datasets"]["coco"]["backbone"] = "resnet101"  # MODEL_ZOO.md's UpDown rows: bottom-up features
    elif change == "beam":
        p["decode"] = {**p["decode"], "beam_size": 3}
    elif change == "split":
        p["evaluate"] = {**p["evaluate"], "split": "val"}
    elif change == "not listed":
        p["datasets"]["coco"] = {k: v for k, v in p["datasets"]["coco"].items() if k != "published"}
    return p


@pytest.mark.parametrize("change", ["backbone", "beam", "split", "not listed"])
def test_no_run_gets_a_number_measured_under_other_conditions(change: str, loaded: dict) -> None:
    params = _without(loaded["updown-coco"], change)
    for run in params["datasets"]["coco"]["runs"]:  # run specs as main_table resolves them
        assert published.match(params, "coco", params_mod.run_spec(params, run)) is None
    table = main_table(params, "coco", scores_of(params))
    assert all(v is None for row in paper_columns(table).values() for v in row.values())
    notes = " ".join(table.notes)
    if change == "not listed":
        assert "MODEL_ZOO.md" not in notes
    else:
        assert "no run here matches one of its rows" in notes and "backbone bottomup" in notes


def test_a_row_matches_by_architecture_method_and_the_options_it_fixes(loaded: dict) -> None:
    """By what was trained, not by name: an SCST run on another reward, or the transformer's XE on the
    step schedule (MODEL_ZOO.md's "Transformer" is transformer.yml's Noam), has no row; NSC is SCST's
    method with baseline nsc and gets the NSC row; a renamed run keeps its row."""
    params = copy.deepcopy(loaded["transformer-coco"])
    runs = params["runs"]
    runs["transformer-xe"]["options"] = {**runs["transformer-xe"]["options"], "lr_schedule": "step"}
    runs["transformer-scst"]["options"] = {**runs["transformer-scst"]["options"], "reward": "bcmr"}
    runs["t-nsc"] = runs.pop("transformer-nsc")
    params["datasets"]["coco"]["runs"] = ["transformer-xe", "transformer-scst", "t-nsc"]
    found = {run: published.match(params, "coco", params_mod.run_spec(params, run)) for run in runs}
    assert found["transformer-xe"] is None and found["transformer-scst"] is None
    assert found["t-nsc"] is not None and found["t-nsc"][2].label == "Transformer+new_self_critical"


def test_the_plan_refuses_an_unknown_set_and_a_set_of_another_dataset(loaded: dict,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    params = copy.deepcopy(loaded["updown-coco"])
    params["datasets"]["coco"]["published"] = ["nope"]
    with pytest.raises(CaprlError, match=r"datasets\.coco\.published: unknown published result set 'nope'"):
        wp.build_plan(params)
    flickr = PublishedSet("a Flickr30k list", "flickr30k", "test", "bottomup", {}, ())
    monkeypatch.setitem(PUBLISHED._entries, "flickr_list", flickr)
    params["datasets"]["coco"]["published"] = ["flickr_list"]
    with pytest.raises(CaprlError, match=r"datasets\.coco\.published: flickr_list holds numbers of dataset flickr30k"):
        wp.build_plan(params)


def test_the_first_listed_set_with_a_row_for_a_run_gives_its_number(loaded: dict,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mine = PublishedSet("another list", "coco", "test", "bottomup", {"method": "beam"},
                        (PublishedRow("UpDown again", "topdown", "xe", {"C": 100.0, "B@4": 30.0}),))
    monkeypatch.setitem(PUBLISHED._entries, "another", mine)
    params = copy.deepcopy(loaded["updown-coco"])
    params["datasets"]["coco"]["published"] = ["another", "scp_model_zoo"]
    papers = paper_columns(main_table(params, "coco", scores_of(params)))
    assert papers["topdown (XE) [topdown-xe]"]["C"] == 100.0 and papers["topdown (XE) [topdown-xe]"]["B@4"] == 30.0
    assert papers["topdown (XE) [topdown-xe]"]["S"] is None  # a set's row is taken whole
    assert papers["topdown (SCST) [topdown-scst]"]["C"] == pytest.approx(122.7)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_every_published_row_names_what_caprl_trains_and_no_run_matches_two(name: str) -> None:
    found = PUBLISHED[name]
    columns = {short for short, _ in METRICS}
    for row in found.rows:
        assert row.arch in MODELS and row.method in OBJECTIVES and set(row.numbers) <= columns
    for i, a in enumerate(found.rows):
        for b in found.rows[i + 1:]:
            if (a.arch, a.method) == (b.arch, b.method):  # told apart by an option both fix differently
                assert any(k in b.options and b.options[k] != v for k, v in a.options.items()), (a.label, b.label)


def test_model_zoo_is_the_commit_the_recipes_cite() -> None:
    text = {name: (REPO / "configs" / "recipes" / f"{name}.yaml").read_text(encoding="utf-8") for name in RECIPES}
    assert all("4c48a33" in t and "MODEL_ZOO.md" in t for t in text.values())
    assert "4c48a33" in PUBLISHED["scp_model_zoo"].source
    for row in PUBLISHED["scp_model_zoo"].rows:  # each row's config is cited by its recipe
        assert any(row.config.rsplit("/", 1)[1] in t for t in text.values()), row.config


def test_caprl_plan_costs_both_recipes(loaded: dict) -> None:
    """The transformer's width is its d_model (no hidden_size key); it is costed as a Top-Down of that
    width until a transformer step is measured, and its basis says so."""
    assert costs.model_hidden(loaded["transformer-coco"]["models"]["transformer"]) == 512
    assert costs.model_hidden(loaded["updown-coco"]["models"]["topdown"]) == 1000
    for recipe in RECIPES:
        rows = [r for r in costs.estimate(loaded[recipe], "h100").rows if r.rule == "train"]
        assert sorted(r.run for r in rows) == sorted(loaded[recipe]["datasets"]["coco"]["runs"])
        assert all(r.hours and r.hours > 1 for r in rows)  # paper scale: hours
        assert all(("fallback: arch transformer" in r.basis) == (recipe == "transformer-coco") for r in rows)
    xe = next(r for r in costs.estimate(loaded["transformer-coco"], "h100").rows if r.run == "transformer-xe")
    assert xe.steps == 15 * 11329  # transformer.yml max_epochs 15 at batch 10 over Karpathy's 113,287 images
