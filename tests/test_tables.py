"""The tables stage: every registered table built from hand-written score files on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from caprl import cli
from caprl.errors import CaprlError
from caprl.objectives import OBJECTIVES, Objective
from caprl.rewards import reward_unavailable_reason
from caprl.tables import build
from caprl.tables.build import TABLES, build_tables, load_scores, main_table, portable
from caprl.tables.pg_spider import pg_spider_table
from caprl.tables.render import Cell
from caprl.tables.runs import dataset_runs
from conftest import default_params, merge

METRICS = {"BLEU-1": 0.5, "BLEU-2": 0.4, "BLEU-3": 0.3, "BLEU-4": 0.2, "METEOR": 0.25, "ROUGE-L": 0.45,
           "CIDEr-D": 1.1}
SPICE_REASON = "java not found on PATH"


class _NotCaptioner(Objective):  # e.g. a listener pre-training run: no caption model, no scores
    captioner = False


@pytest.fixture(autouse=True)
def objectives(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-captioner objective beside the registered ones, for as long as a test runs."""
    monkeypatch.setitem(OBJECTIVES._entries, "listener_pretrain", _NotCaptioner)


def table_params() -> dict[str, Any]:
    return {
        "datasets": {"synthetic": {"enabled": True}, "coco": {"enabled": True}, "flickr30k": {"enabled": False}},
        "evaluate": {"split": "test", "greedy": False, "diversity": {"methods": [], "samples": 5, "beams": 5, "examples": 2}}, "decode": {"method": "beam", "beam_size": 5},
        "models": {"fc": {"arch": "fc"}, "td": {"arch": "topdown"}, "sc": {"arch": "stackcap"}},
        "objectives": {"xe": {"lr": 1e-3, "epochs": 15}, "scst": {"reward": "cider_d"}, "c2f": {"reward": "cider_d"},
                       "pg_spider": {"rollouts": 3, "reward": "cider_d"}, "mixer": {"reward": "cider_d"},
                       "listener_pretrain": {}},
        "rewards": {"cider_d": {"kind": "cider_d"},
                    "bcmr": {"kind": "mix", "weights": {"bleu4": 0.25, "cider_d": 0.25, "meteor": 0.25,
                                                        "rouge_l": 0.25}},
                    "spider": {"kind": "mix", "weights": {"cider_d": 0.5, "spice": 0.5}}},
        "spice": {"corenlp_dir": None},
        "runs": {
            "td-xe": {"method": "xe", "model": "td"},
            "fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 40}},
            "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}},
            "fc-pg-cider": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"}},
            "fc-pg-bcmr": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"},
                           "options": {"reward": "bcmr"}},
            "fc-pg-spider": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"},
                             "options": {"reward": "spider"}},
            "td-pg-cider": {"method": "pg_spider", "model": "td", "init": {"model": "td-xe"}},
            "fc-mix": {"method": "mixer", "model": "fc", "init": {"model": "fc-xe"}},
            "sc-xe-lr1": {"method": "xe", "model": "sc", "options": {"lr": 1e-3}},
            "sc-xe-lr2": {"method": "xe", "model": "sc", "options": {"lr": 2e-3}},
            "sc-c2f-coco": {"method": "c2f", "model": "sc", "init": {"model": "sc-xe-lr1"}, "datasets": ["coco"]},
            "listener": {"method": "listener_pretrain", "model": "fc"},
        },
        "tables": ["main", "pg_spider", "stackcap_table1", "stackcap_table2", "stackcap_table3"],
    }


def write_scores(results: Path, run: str, metrics: dict[str, float] | None = None,
                 unavailable: dict[str, str] | None = None, dataset: str = "synthetic") -> None:
    report = {"run": run, "dataset": dataset, "split": "test", "n_images": 16, "metrics": metrics or METRICS,
              "unavailable": {"SPICE": SPICE_REASON} if unavailable is None else unavailable}
    (results / run).mkdir(parents=True, exist_ok=True)
    (results / run / "scores.json").write_text(json.dumps(report))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """results/synthetic with every run's scores but fc-pg-bcmr (not evaluated yet) and fc-pg-spider."""
    out = tmp_path / "results" / "synthetic"
    for run in ("td-xe", "fc-xe", "fc-scst", "fc-pg-cider", "td-pg-cider", "sc-xe-lr1", "sc-xe-lr2", "fc-mix",
                "most-frequent"):
        write_scores(out, run)
    write_scores(out, "fc-pg-cider", {**METRICS, "SPICE": 0.2}, unavailable={})
    return out


def scores_in(results: Path, params: dict[str, Any], dataset: str = "synthetic") -> dict[str, Any]:
    runs = [v.name for v in dataset_runs(params, dataset)] + ["most-frequent"]
    return load_scores(results, runs, dataset)


def rows(table: Any) -> dict[str, list[Cell]]:
    return dict(table.rows)


def test_every_table_is_registered() -> None:
    assert set(table_params()["tables"]) <= set(TABLES)


def test_only_captioner_runs_on_the_dataset_are_rows() -> None:
    params = table_params()
    names = [v.name for v in dataset_runs(params, "synthetic")]
    assert "listener" not in names and "sc-c2f-coco" not in names
    assert names[:3] == ["td-xe", "fc-xe", "fc-scst"]
    assert [v.name for v in dataset_runs(params, "coco")][-1] == "sc-c2f-coco"
    assert dataset_runs(params, "flickr30k") == []  # not enabled: no run trains on it by default


def test_unknown_method_names_the_run() -> None:
    params = table_params()
    params["runs"]["fc-xe"]["method"] = "nope"
    with pytest.raises(CaprlError, match="runs.fc-xe.method"):
        dataset_runs(params, "synthetic")


def test_main_table_groups_by_model_labels_by_run_and_shows_missing(results: Path, no_spice: str) -> None:
    params = table_params()
    table = main_table(params, "synthetic", scores_in(results, params))
    labels = [label for label, _ in table.rows]
    assert labels == ["fc (XE) [fc-xe]", "fc (SCST) [fc-scst]", "fc (PG-SPIDEr) [fc-pg-cider]",
                      "fc (PG-SPIDEr) [fc-pg-bcmr]", "fc (PG-SPIDEr) [fc-pg-spider]", "fc (MIXER) [fc-mix]",
                      "td (XE) [td-xe]", "td (PG-SPIDEr) [td-pg-cider]", "sc (XE) [sc-xe-lr1]", "sc (XE) [sc-xe-lr2]",
                      "most frequent training caption"]
    cells = rows(table)
    assert cells["fc (XE) [fc-xe]"][6].ours == pytest.approx(110.0)
    assert all(c.ours is None and c.text() == "—" for c in cells["fc (PG-SPIDEr) [fc-pg-bcmr]"])  # not evaluated
    assert all(c.text() == "unavailable" for c in cells["fc (PG-SPIDEr) [fc-pg-spider]"])  # cannot train here
    assert any(n.startswith("fc-pg-spider: unavailable, not trained here: SPICE jars not found in …/")
               for n in table.notes)
    assert "SPICE: not computed (java not found on PATH)." in table.notes
    assert table.title == "synthetic test split: every run (beam 5)"


@pytest.fixture
def no_spice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """This machine as one without SPICE, whatever it has: the reason the rewards module gives."""
    reason = f"SPICE jars not found in {tmp_path}/corenlp"
    monkeypatch.setattr(build, "reward_unavailable_reason",
                        lambda name, params: reason if name == "spider" else None)
    return reason


def test_pg_spider_rows_per_model_and_reward(results: Path, tmp_path: Path, no_spice: str) -> None:
    params = table_params()
    table = pg_spider_table(params, "synthetic", scores_in(results, params))
    assert table.columns == ["B@4", "M", "R", "C", "S", "SPIDEr"]
    labels = [label for label, _ in table.rows]
    assert labels[:5] == ["fc (MLE) [fc-xe]", "fc (SCST) [fc-scst]", "fc (MIXER) [fc-mix]",
                          "fc (PG-CIDEr) [fc-pg-cider]", "fc (PG-BCMR) [fc-pg-bcmr]"]
    labels.remove("fc (MIXER) [fc-mix]")
    assert labels[4] == "fc (PG-SPIDEr) [fc-pg-spider]"
    assert f"fc-pg-spider: unavailable, not trained here: SPICE jars not found in …/{tmp_path.name}/corenlp." \
        in table.notes
    assert labels[5:] == ["td (MLE) [td-xe]", "td (SCST): no run", "td (MIXER): no run",
                          "td (PG-CIDEr) [td-pg-cider]"]
    cells = rows(table)
    pg = cells["fc (PG-CIDEr) [fc-pg-cider]"]
    assert [c.ours for c in pg] == pytest.approx([20.0, 25.0, 45.0, 110.0, 20.0, 65.0])  # SPIDEr = (110 + 20) / 2
    xe = cells["fc (MLE) [fc-xe]"]  # SPICE unavailable: SPIDEr says why, never a number
    assert xe[4].ours is None and xe[5].ours is None
    assert xe[5].text() == "unavailable"
    assert all(c.ours is None and c.text() == "—" for c in cells["fc (PG-BCMR) [fc-pg-bcmr]"])  # missing
    assert all(c.text() == "unavailable" for c in cells[labels[4]])
    assert all(c.text() == "—" for c in cells["td (SCST): no run"])
    md = table.markdown()
    assert str(tmp_path) not in md and "SPICE: not computed (java not found on PATH)." in md
    assert "SPIDEr = (CIDEr-D + SPICE) / 2" in md
    csv_row = next(line for line in table.csv().splitlines() if line.startswith("fc (MLE)"))
    assert csv_row.endswith("unavailable,,")


def test_pg_spider_table_has_a_mixer_row_chosen_by_method(results: Path, no_spice: str) -> None:
    """MIXER (Ranzato et al.), the paper's comparison baseline, is a row of every model with a
    pg_spider or mixer run, labelled as the paper does, found by method whatever the run's
    name; the paper's summary gives it no number; a MIXER run that cannot train here says why."""
    params = table_params()
    params["runs"]["baseline-of-liu"] = params["runs"].pop("fc-mix")  # any name: rows are found by method
    write_scores(results, "baseline-of-liu", {**METRICS, "CIDEr-D": 1.05})
    params["runs"]["sc-mix"] = {"method": "mixer", "model": "sc", "init": {"model": "sc-xe-lr1"},
                                "options": {"reward": "spider"}}  # a model with a mixer run only
    table = pg_spider_table(params, "synthetic", scores_in(results, params))
    labels = [label for label, _ in table.rows]
    assert labels.index("fc (MIXER) [baseline-of-liu]") == labels.index("fc (SCST) [fc-scst]") + 1
    assert labels[labels.index("td (MLE) [td-xe]"):] == [
        "td (MLE) [td-xe]", "td (SCST): no run", "td (MIXER): no run", "td (PG-CIDEr) [td-pg-cider]",
        "sc (MLE) [sc-xe-lr1]", "sc (MLE) [sc-xe-lr2]", "sc (SCST): no run", "sc (MIXER) [sc-mix]"]
    cells = rows(table)
    assert cells["fc (MIXER) [baseline-of-liu]"][3].ours == pytest.approx(105.0)
    assert all(c.paper is None for _, cs in table.rows for c in cs)
    assert [c.text() for c in cells["sc (MIXER) [sc-mix]"]] == ["unavailable"] * 6
    assert any(n.startswith("sc-mix: unavailable, not trained here: SPICE jars") for n in table.notes)
    assert any("MIXER = Ranzato et al. 2016" in n and "no MIXER numbers" in n for n in table.notes)


def test_the_repository_params_put_fc_lstm_mixer_in_the_pg_spider_table() -> None:
    params = default_params()
    mixer = params["runs"]["fc_lstm-mixer"]
    assert (mixer["method"], mixer["model"], mixer["init"]) == ("mixer", "fc_lstm", {"model": "fc_lstm-xe"})
    table = pg_spider_table(params, "synthetic", {})
    labels = [label for label, _ in table.rows]
    assert "fc_lstm (MIXER) [fc_lstm-mixer]" in labels  # paper 001's model only: fc's runs are other papers'
    assert labels[:2] == ["fc_lstm (MLE) [fc_lstm-xe]", "fc_lstm (SCST) [fc_lstm-scst]"]
    assert not any(label.startswith("fc ") for label in labels)


def test_pg_spider_run_with_scores_is_shown_whatever_this_machine_lacks(results: Path, no_spice: str) -> None:
    params = table_params()
    write_scores(results, "fc-pg-spider", {**METRICS, "SPICE": 0.1}, unavailable={})
    cells = rows(pg_spider_table(params, "synthetic", scores_in(results, params)))
    assert cells["fc (PG-SPIDEr) [fc-pg-spider]"][5].ours == pytest.approx(60.0)


def test_pg_spider_table_without_runs_says_so(results: Path) -> None:
    params = table_params()
    params["runs"] = {k: v for k, v in params["runs"].items() if v["method"] not in ("pg_spider", "mixer")}
    table = pg_spider_table(params, "synthetic", scores_in(results, params))
    assert table.rows == [] and "No pg_spider run trains on synthetic." in table.notes


def test_spider_needs_spice_computed_or_evaluated(results: Path) -> None:
    params = table_params()
    write_scores(results, "fc-scst", unavailable={})  # SPICE not in evaluate.metrics
    cells = rows(pg_spider_table(params, "synthetic", scores_in(results, params)))
    assert cells["fc (SCST) [fc-scst]"][5].text() == "not evaluated"


def paper_000_models(params: dict[str, Any]) -> dict[str, Any]:
    """table_params with its models under paper 000's names (the Stack-Cap tables read models by name)."""
    names = {"fc": "fc_lstm", "sc": "stackcap"}
    params["models"] = {names.get(m, m): spec for m, spec in params["models"].items()}
    for spec in params["runs"].values():
        spec["model"] = names.get(spec["model"], spec["model"])
    return params


def test_stackcap_tables_use_model_method_and_dataset(results: Path) -> None:
    params = paper_000_models(table_params())
    tables = build_tables(params, "synthetic", scores_in(results, params))
    t1 = rows(tables["stackcap_table1"])
    assert t1["Stack-Cap (XE) [sc-xe-lr1]"][5].ours == pytest.approx(110.0)
    assert "Stack-Cap (XE) [sc-xe-lr2]" in t1
    assert all(c.ours is None for c in t1["LSTM3 layers (XE)"])
    t2 = rows(tables["stackcap_table2"])
    assert all(c.ours is None for c in t2["Stack-Cap (C2F)"])  # its only c2f run trains on coco
    assert t2["LSTM (SCST, CIDEr)"][0].ours == pytest.approx(50.0)


def test_coco_tables_carry_the_paper_numbers(tmp_path: Path) -> None:
    params = paper_000_models(table_params())
    coco = tmp_path / "results" / "coco"
    write_scores(coco, "sc-c2f-coco", dataset="coco")
    t2 = rows(build_tables(params, "coco", scores_in(coco, params, "coco"))["stackcap_table2"])
    assert t2["Stack-Cap (C2F)"][5] == Cell(pytest.approx(110.0), 120.4)


def test_load_scores_refuses_another_run_or_dataset(tmp_path: Path) -> None:
    write_scores(tmp_path, "a", dataset="coco")
    with pytest.raises(CaprlError, match="not of --dataset synthetic"):
        load_scores(tmp_path, ["a"], "synthetic")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "scores.json").write_text(json.dumps({"run": "a", "metrics": {}}))
    with pytest.raises(CaprlError, match="'a', not of 'b'"):
        load_scores(tmp_path, ["b"])
    assert load_scores(tmp_path, ["missing"]) == {}


def test_unknown_table_is_an_error_naming_the_key() -> None:
    params = {**table_params(), "tables": ["main", "nope"]}
    with pytest.raises(CaprlError, match="tables: unknown table.*nope"):
        build_tables(params, "synthetic", {})


def test_portable_paths_in_notes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    text = (f"x missing from /usr/lib/python3/site-packages/pycocoevalcap/spice/lib; "
            f"no jar in {tmp_path}/tools/corenlp (see /opt/a/b/c.jar)")
    assert portable(text) == ("x missing from <python packages>/pycocoevalcap/spice/lib; "
                              "no jar in tools/corenlp (see …/b/c.jar)")
    assert portable("java not found on PATH") == "java not found on PATH"
    note = build.unavailable_notes({"r": {"unavailable": {"SPICE": f"missing {tmp_path}/lib"}}})
    assert note == ["SPICE: not computed (missing lib)."]


def test_main_writes_every_table_of_the_dataset(tmp_path: Path) -> None:
    """``caprl tables`` on the repository's params.yaml (validated), some runs not evaluated."""
    params = merge(default_params(), {"spice": {"corenlp_dir": str(tmp_path / "no-corenlp")}})
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    results, out = tmp_path / "results" / "synthetic", tmp_path / "results" / "tables"
    for run in ("fc-xe", "fc-scst", "fc_lstm-pg_spider-cider_d", "most-frequent"):
        write_scores(results, run)
    assert cli.main(["tables", "--params", str(params_file), "--dataset", "synthetic",
                     "--results-dir", str(results), "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"synthetic_{t}.{e}" for t in params["tables"]
                                                          for e in ("md", "csv", "tex"))
    main_md = (out / "synthetic_main.md").read_text()
    assert "fc (SCST) [fc-scst]" in main_md and "fc_lstm (PG-SPIDEr) [fc_lstm-pg_spider-bcmr] | — |" in main_md
    pg_md = (out / "synthetic_pg_spider.md").read_text()
    spider_row = "fc_lstm (PG-SPIDEr) [fc_lstm-pg_spider-spider]"
    if reward_unavailable_reason("spider", params):  # no CoreNLP jars on this machine (the usual case)
        assert f"| {spider_row} | unavailable |" in pg_md
        assert "fc_lstm-pg_spider-spider: unavailable, not trained here: reward 'spider'" in pg_md
    else:
        assert f"| {spider_row} | — |" in pg_md
    assert str(tmp_path) not in pg_md + main_md
    assert cli.main(["tables", "--params", str(params_file), "--dataset", "nope",
                     "--results-dir", str(results), "--out-dir", str(out)]) == 2  # datasets.nope: no such dataset


def test_main_table_says_which_runs_kept_their_starting_weights() -> None:
    """An RL run whose every epoch was worse on val than its start keeps the start (best_epoch 0,
    written by caprl evaluate from the checkpoint): the table says so; XE runs and improved runs not."""
    params = table_params()
    scores = {"fc-xe": {"run": "fc-xe", "metrics": METRICS, "best_epoch": 40},
              "fc-scst": {"run": "fc-scst", "metrics": METRICS, "best_epoch": 0},
              "fc-pg-cider": {"run": "fc-pg-cider", "metrics": METRICS, "best_epoch": 3}}
    notes = main_table(params, "synthetic", scores).notes
    kept = [n for n in notes if "beat its starting weights" in n]
    assert kept == ["fc-scst: no trained epoch beat its starting weights on validation, so its row is the start "
                    "(model from fc-xe)."]


def test_main_table_has_the_greedy_cider_column_when_evaluate_greedy_is_set() -> None:
    """``evaluate.greedy``: a "C greedy" column from each score file's ``greedy`` section (— where
    a score file has none); the most-frequent baseline's single caption scores the same either way."""
    params = table_params()
    scores = {"fc-xe": {"run": "fc-xe", "metrics": METRICS, "greedy": {"metrics": {"CIDEr-D": 0.9}}},
              "fc-scst": {"run": "fc-scst", "metrics": METRICS},
              "most-frequent": {"run": "most-frequent", "metrics": {**METRICS, "CIDEr-D": 0.3}}}
    assert "C greedy" not in main_table(params, "synthetic", scores).columns
    params["evaluate"]["greedy"] = True
    table = main_table(params, "synthetic", scores)
    greedy, c = table.columns.index("C greedy"), table.columns.index("C")
    assert table.columns[c:greedy + 1] == ["C", "S", "C greedy"]
    cells = rows(table)
    assert cells["fc (XE) [fc-xe]"][greedy].ours == pytest.approx(90.0)
    assert cells["fc (SCST) [fc-scst]"][greedy].ours is None
    assert [c.ours for c in cells["most frequent training caption"][c:greedy + 1]] == [pytest.approx(30.0), None,
                                                                                      pytest.approx(30.0)]
    assert any(n.startswith("C greedy: CIDEr-D of the greedy captions") for n in table.notes)


def test_tables_read_the_evaluated_split_and_decoding_through_their_typed_settings() -> None:
    """TableSettings holds what params.yaml says of the evaluation (split, decoding, greedy column,
    diversity sets, lookahead) and the models' order; no table module but it reads those sections
    from the params dict (the published sets match the split themselves)."""
    from caprl import params as params_mod
    from caprl.tables.settings import TableSettings

    repo = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    s = TableSettings.from_params(params_mod.load(repo / "params.yaml"))
    ev = raw["evaluate"]
    assert (s.split, s.greedy, dict(s.decode)) == (ev["split"], ev["greedy"], raw["decode"])
    assert (s.diversity.samples, s.diversity.beams, list(s.diversity.methods)) == (
        ev["diversity"]["samples"], ev["diversity"]["beams"], ev["diversity"]["methods"])
    assert (s.lookahead.lam, s.lookahead.candidates) == (ev["lookahead"]["lam"], ev["lookahead"]["candidates"])
    assert s.models == tuple(raw["models"]) and s.model_rank("not-a-model") == len(raw["models"])
    assert s.decoding() == f"beam {raw['decode']['beam_size']}" and s.decoding({"method": "greedy"}) == "greedy"
    offenders = [f"{f.name}: {key}" for f in sorted((repo / "src/caprl/tables").glob("*.py"))
                 if f.name not in ("settings.py", "published.py")
                 for key in ('params["evaluate"]', 'params["decode"]', "params['evaluate']", "params['decode']")
                 if key in f.read_text()]
    assert offenders == []
