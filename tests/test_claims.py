"""benchmarks/claims.py: paired intervals, verdicts, and the claims configurations themselves."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
from scipy import stats

from conftest import REPO

spec = importlib.util.spec_from_file_location("claims", REPO / "benchmarks" / "claims.py")
claims = importlib.util.module_from_spec(spec)
sys.modules["claims"] = claims
spec.loader.exec_module(claims)


def test_the_interval_is_students_t_over_the_paired_differences():
    diffs = [1.0, 2.0, 0.5, 1.5, 3.0]
    mean, sd, lo, hi = claims.interval(diffs)
    ref = stats.t.interval(0.95, len(diffs) - 1, loc=sum(diffs) / 5, scale=stats.sem(diffs))
    assert mean == pytest.approx(1.6) and sd == pytest.approx(stats.tstd(diffs))
    assert (lo, hi) == pytest.approx(ref)


@pytest.mark.parametrize("kind, lo, hi, margin, verdict", [
    ("greater", 0.1, 2.0, 0, "holds"), ("greater", -0.1, 2.0, 0, "unresolved"), ("greater", -2.0, -0.1, 0, "reversed"),
    ("less", 0.2, 0.9, 0, "holds"),  # less: the difference is b - a
    ("at_least", -0.9, 0.5, 1.0, "holds"), ("at_least", -1.5, 0.5, 1.0, "unresolved"),
    ("at_least", -3.0, -1.2, 1.0, "reversed")])
def test_verdicts(kind, lo, hi, margin, verdict):
    assert claims.verdict(kind, lo, hi, margin) == verdict


def seed_result(a: float, b: float, look: float) -> dict:
    table = "row,R@10\nPSST Multinomial,41.5%\nLuo et al. 2018,—\n"
    return {"runs": {"ds/a": {"metrics": {"CIDEr-D": a}, "lookahead": {"metrics": {"CIDEr-D": look}}},
                     "ds/b": {"metrics": {"CIDEr-D": b}}},
            "tables": {"ds/psst_table2": table}}


def test_resolve_pairs_seeds_reads_metrics_tables_and_other_metrics_of_one_run():
    per_seed = {s: seed_result(1.0 + 0.01 * s, 0.9, 1.2) for s in range(1, 6)}
    config = {"claims": [
        {"id": "x", "text": "a > b", "a": "ds/a", "b": "ds/b", "metric": "metrics.CIDEr-D", "kind": "greater"},
        {"id": "y", "text": "look", "a": "ds/a", "b": "ds/a", "metric": "lookahead.metrics.CIDEr-D",
         "b_metric": "metrics.CIDEr-D", "kind": "at_least", "margin": 1.0},
        {"id": "z", "text": "cells", "dataset": "ds", "a": {"table": "psst_table2", "row": "PSST Multinomial",
                                                            "column": "R@10"},
         "b": {"table": "psst_table2", "row": "Luo et al. 2018", "column": "R@10"}, "kind": "greater"}]}
    x, y, z = claims.resolve(config, per_seed)
    assert x["a"] == pytest.approx([101, 102, 103, 104, 105]) and x["b"] == pytest.approx([90.0] * 5)  # in %
    assert x["diff"] == pytest.approx(13.0) and x["verdict"] == "holds" and x["n"] == 5
    assert y["mean_a"] == pytest.approx(120.0) and y["verdict"] == "holds"
    assert z["a"] == [41.5] * 5 and all(math.isnan(v) for v in z["b"])
    assert z["verdict"] == "unresolved" and "0 seed(s)" in z["why"]  # a curve that never reaches the point
    md = claims.paper_markdown({"paper": "9", "title": "t"}, [x, y, z],
                               {"n_seeds": 5, "seeds": [1, 2, 3, 4, 5], "test_images": 1000, "seconds": 1,
                                "cores": 2, "commit": "abc", "date": "2026-01-01", "config": "c.yaml"})
    assert "| a > b |" in md and "**holds**" in md and "**unresolved**" in md


def test_sides_equal_in_every_seed_are_unresolved_and_say_why():
    per_seed = {s: seed_result(1.0, 1.0, 1.0) for s in range(1, 6)}
    config = {"claims": [{"id": "x", "text": "a > b", "a": "ds/a", "b": "ds/b", "metric": "metrics.CIDEr-D",
                          "kind": "greater"}]}
    (x,) = claims.resolve(config, per_seed)
    assert x["verdict"] == "unresolved" and x["diff"] == 0.0 and "same weights" in x["why"]
    per_seed[3]["runs"]["ds/a"]["metrics"]["CIDEr-D"] = 1.01  # one seed differs: no such note
    (y,) = claims.resolve(config, per_seed)
    assert "why" not in y


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "claims").glob("*.yaml")), ids=lambda p: p.name)
def test_every_claims_config_is_sized_to_resolve_and_names_its_own_runs(path):
    """At least 5 seeds and 1,000 test images; every run a claim reads is one the config trains."""
    from caprl import params as params_mod

    config = claims.load_config(path)
    assert len(config["seeds"]) >= claims.MIN_SEEDS and path.name.startswith(config["paper"])
    params = claims.seed_params(config, config["seeds"][0])
    assert params["synthetic"]["n_test"] >= 1000
    runs = params_mod.expand_sweeps(params)["runs"]
    for claim in config["claims"]:
        for side in ("a", "b"):
            ref = claim[side]
            if isinstance(ref, str):
                assert ref.split("/", 1)[1] in runs, (claim["id"], ref)
            else:
                assert ref["table"] in params["tables"], (claim["id"], ref)


@pytest.mark.e2e
def test_a_seed_runs_the_real_workflow_in_a_relative_workdir(tmp_path, monkeypatch):
    """run_seed with a relative folder (the default --workdir, claims/): the real Snakemake builds the
    seed's scores there, once (the folder was resolved twice: claims/p/seed1/claims/p/seed1)."""
    from conftest import TINY

    monkeypatch.chdir(tmp_path)
    config = {"params": {**{k: v for k, v in TINY.items() if k != "runs"}, "runs": ["fc-xe"],
                         "evaluate": {"metrics": ["bleu", "cider_d"], "diversity": {"methods": []}}},
              "claims": []}
    out = claims.run_seed(config, 1, claims.Path("claims") / "p" / "seed1", cores=2)
    scores = out["runs"]["synthetic/fc-xe"]
    assert scores["n_images"] == TINY["synthetic"]["n_test"] and 0 <= scores["metrics"]["CIDEr-D"]
    assert (tmp_path / "claims" / "p" / "seed1" / "params.yaml").exists()
    assert not (tmp_path / "claims" / "p" / "seed1" / "claims").exists()


def test_the_commit_is_dirty_for_code_not_for_the_claims_own_outputs(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q"); git("config", "user.email", "t@t"); git("config", "user.name", "t")
    (tmp_path / "results" / "claims").mkdir(parents=True)
    for name in ("README.md", "results/claims/000.md", "code.py"):
        (tmp_path / name).write_text("a\n")
    git("add", "."); git("commit", "-qm", "x")
    monkeypatch.setattr(claims, "REPO", tmp_path)
    (tmp_path / "README.md").write_text("b\n")  # the summary --readme writes after each paper
    (tmp_path / "results" / "claims" / "000.md").write_text("b\n")
    assert not claims.commit().endswith("-dirty")
    (tmp_path / "code.py").write_text("b\n")
    assert claims.commit().endswith("-dirty")
