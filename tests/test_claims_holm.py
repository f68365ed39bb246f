"""caprl.claims.verdicts: the paired t-test's p, Holm-Bonferroni over a paper's claims, the counts
both ways, and ``caprl claims --render-only`` (the pages again from the stored values)."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

import yaml

from caprl.claims import pages
from caprl.claims import verdicts
from caprl.claims import verdicts as cv
from caprl.errors import CaprlError
from conftest import REPO

SEEDS = [1, 2, 3, 4, 5]


def entry(i: str, p: float, diff: float = 1.0, kind: str = "greater", margin: float = 0.0) -> dict:
    return {"id": i, "p": p, "diff": diff, "kind": kind, "margin": margin}


def test_holm_against_a_hand_computed_family():
    """p sorted 0.01, 0.03, 0.04: x3, x2, x1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06."""
    out = cv.holm([entry("a", 0.01), entry("b", 0.04), entry("c", 0.03, diff=-2.0)])
    assert [r["p_holm"] for r in out] == pytest.approx([0.03, 0.06, 0.06])
    assert [r["holm"] for r in out] == ["holds", "unresolved", "unresolved"]
    assert {r["holm_m"] for r in out} == {3}
    (rev,) = cv.holm([entry("r", 0.001, diff=-3.0)])
    assert rev["holm"] == "reversed"  # the sign of the difference from the null value
    # a margin claim: its null is -m, so a difference of -0.5 with m = 1 lies above it
    (ok,) = cv.holm([entry("m", 0.001, diff=-0.5, kind="at_least", margin=1.0)])
    assert ok["holm"] == "holds"


def test_an_untested_claim_enters_the_family_with_p_1():
    """A claim unresolved for a missing seed has no p: it counts in the family's size (p = 1), so the
    others' correction is that of the config's whole family, and it stays unresolved."""
    out = cv.holm([entry("a", 0.01), entry("b", 0.02), entry("gone", math.nan)])
    assert [r["p_holm"] for r in out[:2]] == pytest.approx([0.03, 0.04])  # x3, x2: m = 3, not 2
    assert math.isnan(out[2]["p_holm"]) and out[2]["holm"] == "unresolved" and out[2]["holm_m"] == 3


@pytest.mark.parametrize("diffs, null", [([1.0, 2.0, 0.5, 1.5, 3.0], 0.0), ([0.1, -0.4, 0.3, 0.2, -0.1], 0.0),
                                         ([-0.5, -0.2, 0.1, -0.9, -0.3], -1.0)])
def test_the_p_is_the_t_test_the_interval_inverts(diffs, null):
    p = cv.p_value(diffs, null)
    assert p == pytest.approx(stats.ttest_1samp(diffs, popmean=null).pvalue)
    _, _, lo, hi = cv.interval(diffs)
    assert (p < 0.05) == (not lo <= null <= hi)


def test_equal_differences_have_p_0_or_1():
    assert cv.p_value([2.0] * 5, 0.0) == 0.0 and cv.p_value([0.0] * 5, 0.0) == 1.0


def claim(i: str) -> dict:
    return {"id": i, "text": f"{i}: a > b", "source": "s", "a": f"ds/{i}a", "b": f"ds/{i}b",
            "metric": "metrics.CIDEr-D", "kind": "greater"}


def per_seed(gaps: dict[str, list[float]]) -> dict[int, dict]:
    """Each claim's runs in each seed: side a is side b (1.0) + the claim's gap in that seed."""
    return {s: {"runs": {**{f"ds/{i}a": {"metrics": {"CIDEr-D": 1.0 + g[k]}} for i, g in gaps.items()},
                         **{f"ds/{i}b": {"metrics": {"CIDEr-D": 1.0}} for i in gaps}}}
            for k, s in enumerate(SEEDS)}


GAPS = {"strong": [0.5, 0.6, 0.55, 0.45, 0.5],  # a clear difference: holds both ways
        "weak": [0.02, 0.03, 0.005, 0.04, 0.01],  # p 0.031: holds alone, not among four
        "null1": [0.01, -0.02, 0.015, -0.01, 0.0], "null2": [-0.01, 0.02, 0.0, 0.01, -0.015]}


def test_a_claim_that_holds_alone_is_unresolved_after_holm_and_the_pages_say_both():
    config = {"paper": "9", "title": "t", "seeds": SEEDS, "claims": [claim(i) for i in GAPS]}
    results = verdicts.resolve(config, per_seed(GAPS))
    by = {r["id"]: r for r in results}
    weak = by["weak"]
    assert weak["verdict"] == "holds" and weak["lo"] > 0 and weak["p"] < 0.05
    assert weak["p_holm"] >= 0.05 and weak["holm"] == "unresolved"
    assert by["strong"]["verdict"] == by["strong"]["holm"] == "holds"
    assert all(r["holm_m"] == 4 for r in results)
    line = verdicts.claim_line(weak)
    assert line.endswith(f"| **holds** | {weak['p']:.3f} | {weak['p_holm']:.3f} | **unresolved** |")
    assert cv.counts(results, "verdict") == {"holds": 2, "reversed": 0, "unresolved": 2}
    assert cv.counts(results, "holm") == {"holds": 1, "reversed": 0, "unresolved": 3}
    meta = {"n_seeds": 5, "seeds": SEEDS, "test_images": 10, "seconds": 1, "cores": 2, "commit": "abc",
            "date": "2026-01-01", "config": "c.yaml"}
    md = verdicts.paper_markdown(config, results, meta)
    assert "the family is this paper's 4 claims" in md and "enters the family with p = 1" in md
    assert "by their 95% intervals 2 hold, 0 reversed, 2 unresolved; after Holm over the 4: 1 hold" in md


def test_the_summary_counts_both_ways_per_paper_and_in_total(tmp_path):
    meta = {"commit": "abc", "date": "2026-01-01"}
    config = {"seeds": SEEDS, "claims": [claim(i) for i in GAPS]}
    results = verdicts.resolve(config, per_seed(GAPS))
    (tmp_path / "001.json").write_text(json.dumps({"paper": "001", "meta": meta, "results": results}))
    missing = verdicts.resolve({"seeds": SEEDS, "claims": [claim("strong")]}, {1: per_seed(GAPS)[1]})
    assert missing[0]["verdict"] == missing[0]["holm"] == "unresolved"  # seeds 2-5 not run: not tested
    (tmp_path / "002.json").write_text(json.dumps({"paper": "002", "meta": meta, "results": missing}))
    summary = verdicts.summary_markdown(tmp_path)
    assert "| 001 | 4 | 2 / 0 / 2 | 1 / 0 / 3 |" in summary
    assert "| 002 | 1 | 0 / 0 / 1 | 0 / 0 / 1 |" in summary
    assert "| **total** | 5 | 2 / 0 / 3 | 1 / 0 / 4 |" in summary
    assert "| 002 | strong: a > b |" in summary and "seed 2: not run" in summary


def test_render_only_redecides_the_stored_values_without_the_workflow(tmp_path):
    """A json as an earlier run wrote it (no p, no Holm): --render-only adds them from each claim's
    stored per-seed values, keeps those values and the per-seed data, and stamps the page."""
    config = {"paper": "009", "title": "t", "seeds": SEEDS, "demo": {}, "claims": [claim(i) for i in GAPS]}
    results = verdicts.resolve(config, per_seed(GAPS))
    old = [{k: v for k, v in r.items() if k not in ("p", "p_holm", "holm", "holm_m")} for r in results]
    meta = {"n_seeds": 5, "seeds": SEEDS, "test_images": 10, "seconds": 1, "cores": 2, "commit": "abc",
            "date": "2026-01-01", "config": "c.yaml"}
    out = tmp_path / "out"
    out.mkdir()
    (out / "009.json").write_text(json.dumps({"paper": "009", "title": "t", "meta": meta, "results": old,
                                              "per_seed": {"1": {"kept": True}}}))
    path = tmp_path / "009_t.yaml"
    path.write_text(yaml.safe_dump(config))
    pages.render(path, out / "009.json")
    stored = json.loads((out / "009.json").read_text())
    assert stored["per_seed"] == {"1": {"kept": True}} and stored["meta"]["rendered"]["date"]
    for new, before in zip(stored["results"], results):
        assert new["a"] == before["a"] and new["verdict"] == before["verdict"]
        assert new["p_holm"] == pytest.approx(before["p_holm"]) and new["holm"] == before["holm"]
    assert "**Verdicts rendered** at" in (out / "009.md").read_text()
    path.write_text(yaml.safe_dump({**config, "claims": config["claims"][:2]}))  # changed since: --reread
    with pytest.raises(CaprlError, match="--reread"):
        pages.render(path, out / "009.json")


def test_the_stored_pages_carry_holm_and_agree_with_their_intervals():
    """results/claims/*.json: every resolved claim's p is below 0.05 exactly where its interval
    verdict is not unresolved, and Holm never resolves what the interval leaves unresolved."""
    for path in sorted((REPO / "results" / "claims").glob("[0-9][0-9][0-9].json")):
        for r in json.loads(path.read_text())["results"]:
            assert r["holm"] in cv.VERDICTS and r["holm_m"] >= 1, (path.name, r["id"])
            if r["missing"]:
                assert math.isnan(r["p"]) and r["holm"] == "unresolved"
                continue
            assert (r["p"] < 0.05) == (r["verdict"] != "unresolved"), (path.name, r["id"])
            assert r["holm"] in ("unresolved", r["verdict"]) and r["p_holm"] >= r["p"]


def test_the_forest_plot_has_a_row_per_claim_and_the_same_bytes_for_the_same_results(tmp_path):
    """The stored results of paper 004 (22 claims, some without an interval): a PNG whose height grows
    with the claims, the same bytes when drawn twice (no version or date in it)."""
    from PIL import Image

    from caprl.claims.forest import forest_png

    stored = json.loads((REPO / "results" / "claims" / "004.json").read_text())
    config = {"paper": "004", "title": stored["title"]}
    forest_png(config, stored["results"], tmp_path / "a.png")
    forest_png(config, stored["results"], tmp_path / "b.png")
    forest_png(config, stored["results"][:2], tmp_path / "two.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    many, two = Image.open(tmp_path / "a.png").size, Image.open(tmp_path / "two.png").size
    assert many[0] == two[0] and many[1] > 5 * two[1] / 2
    assert any(math.isnan(r["lo"]) for r in stored["results"])  # the rows that say why they have no interval
    one_seed = [{**r, "lo": -math.inf, "hi": math.inf, "n": 1, "missing": []} for r in stored["results"][:2]]
    forest_png(config, one_seed, tmp_path / "one_seed.png")  # an interval of one seed is infinite: a row saying so
    assert Image.open(tmp_path / "one_seed.png").size == two
