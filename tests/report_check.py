"""Checks of a finished workflow's `snakemake --report` and learning curves (tests/test_e2e.py).

:func:`check_report` builds the report, checks that it holds every table and figure under its
dataset and paper, and, where Chromium is (or can be installed), screenshots its views and
checks what they show. Set ``CAPRL_REPORT_SCREENS`` to a folder to keep the screenshots.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any
import yaml

from caprl.workflow.plan import build_plan
from screenshot import chromium_path, non_trivial, screenshot, visible_text

# the report's subcategory of a table or figure starts with its paper's tag (workflow/rules/figures.smk)
PAPER_TAGS = {"main": "All methods", "stackcap": "000 ", "pg_spider": "001 ", "sle": "002 ", "ac": "003 ",
              "psst": "004 ", "attention": "000 ", "curves": "Learning curves"}



def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def embedded(html: str, name: str) -> dict[str, Any]:
    """The JSON the report embeds as ``var <name> = {...};`` (results, categories)."""
    match = re.search(rf"<script id=\"{name}\">\s*var {name} = (.*?);\s*</script>", html, re.S)
    assert match, f"no '{name}' in the report"
    return json.loads(match.group(1))


def expected_files(workdir: Path) -> dict[str, tuple[str, str]]:
    """Every table (its CSV) and figure the report must show -> (its dataset, the start of its subcategory)."""
    plan = build_plan(yaml.safe_load((workdir / "params.yaml").read_text()))
    expected = {}
    for ds in plan.datasets:
        for table in plan.tables(ds):
            tag = next(tag for key, tag in PAPER_TAGS.items() if table == key or table.startswith(f"{key}_"))
            expected[next(p for p in plan.table_files(ds) if p.endswith(f"/{ds}_{table}.csv"))] = (ds, tag)
        expected |= {path: (ds, PAPER_TAGS["attention"]) for path in plan.attention_pngs(ds)}
        expected |= {path: (ds, PAPER_TAGS["psst"]) for path in plan.psst_pngs(ds)}
        expected |= {path: (ds, PAPER_TAGS["curves"]) for path in plan.curve_files(ds) if path.endswith(".png")}
    return expected


def report_view(html: str, script: str) -> str:
    """The report with ``script`` run once it has loaded (it drives the report's React app)."""
    head, tail = html.rsplit("</body>", 1)
    return head + f"<script>window.addEventListener('load', () => setTimeout(() => {{ {script} }}, 100));</script></body>" + tail


def check_report(workdir: Path, out_png: Path, screens: bool = True) -> list[Path]:
    """Run `snakemake --report report.html` in ``workdir`` (where all_tables has finished); check
    it holds every table and figure, each under its dataset and its paper; with Chromium (and
    ``screens``), take screenshots (``out_png``, and views beside it) and check them. Returns the
    screenshots."""
    run(["snakemake", "--report", "report.html"], workdir)
    html = (workdir / "report.html").read_text(encoding="utf-8")
    results, categories = embedded(html, "results"), embedded(html, "categories")
    expected = expected_files(workdir)
    missing = sorted(set(expected) - set(results))
    assert not missing, f"not in the report: {missing}"
    placed = {path: (cat, sub) for cat, subs in categories.items() for sub, paths in subs.items() for path in paths}
    for path, (dataset, tag) in expected.items():
        cat, sub = placed[path]
        assert cat == dataset and sub.startswith(tag), f"{path}: under {cat} / {sub}"
        assert results[path]["caption"].strip(), f"{path}: no caption"
        assert str(workdir) not in results[path]["caption"], f"{path}: the caption names this machine's path"
    if not screens or chromium_path() is None:
        return []
    dataset = sorted(categories)[0]
    table = next(p for p in expected if p.endswith(".csv"))
    overview = next(p for p in expected if p.endswith("curves_val_cider.png"))
    views = {  # name -> (script, texts its page must show)
        "": ("", ["Results", "grouped by"]),
        "dataset": (f"app.showCategory({json.dumps(dataset)});", list(categories[dataset])),
        "table": (f"app.showResultInfo({json.dumps(table)});", ["approach", "Description", "caprl tables"]),
        "figure": (f"app.setView({{content: 'img', navbarMode: 'resultinfo', resultPath: {json.dumps(overview)},"
                   f" contentPath: results[{json.dumps(overview)}].data_uri}});", ["(all runs) validation CIDEr-D", "every captioning run"]),
    }
    shots = []
    for name, (script, texts) in views.items():
        page = workdir / f"report_{name or 'index'}.html"
        page.write_text(report_view(html, script) if script else html, encoding="utf-8")
        png = out_png if not name else out_png.with_name(f"{out_png.stem}_{name}.png")
        dom = workdir / f"{page.stem}.dom.html"
        shots.append(screenshot(page, png, 1600, 1000, 3000, dom=dom))
        assert non_trivial(png), f"{png.name} is blank"
        rendered = dom.read_text(encoding="utf-8")
        shown = visible_text(rendered)
        assert all(text in shown for text in texts), f"{png.name}: {[t for t in texts if t not in shown]} not shown"
        if name == "figure":
            assert '<img src="data:image/png' in rendered, "the figure is not shown"
    return shots


def check_curves(finished_workflow: Path) -> None:
    """The curves job read every run's history: its CSVs hold the history's numbers (an empty
    val_cider where a run, e.g. the listener's pre-training, has no validation CIDEr-D)."""
    curves = finished_workflow / "results" / "figures" / "synthetic" / "curves"
    for run_dir in sorted((finished_workflow / "runs" / "synthetic").iterdir()):
        history = json.loads((run_dir / "history.json").read_text())
        with open(curves / f"{run_dir.name}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [int(r["epoch"]) for r in rows] == [e["epoch"] for e in history["epochs"]]
        # epoch 0 (an init run's starting weights) has no training loss: null in the history, empty in the CSV
        assert [float(r["train_loss"]) if r["train_loss"] else None for r in rows] == \
            [e["train_loss"] for e in history["epochs"]]
        cider = [e.get("val_CIDEr-D") for e in history["epochs"]]
        assert [float(r["val_cider"]) if r["val_cider"] else None for r in rows] == cider
        assert str(finished_workflow) not in (curves / f"{run_dir.name}.csv").read_text()


def check_mlflow_compare(workdir: Path, out_png: Path, runs: tuple[str, str], screens: bool = True) -> Path | None:
    """Start `mlflow server` on ``workdir``'s mlflow.db, open the compare view of two training
    runs (``runs``: their names, e.g. ``synthetic/fc-xe``) in headless Chromium and check that it
    shows their params and test metrics side by side; the screenshot (None without Chromium or
    ``screens``: then only the runs' test metrics are checked)."""
    import socket
    import urllib.parse
    import urllib.request

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("caprl")
    by_job = {r.data.tags.get("caprl.job"): r for r in client.search_runs([exp.experiment_id], max_results=5000)}
    chosen = [by_job[f"{name}/train"] for name in runs]
    assert all("test/CIDEr-D" in r.data.metrics for r in chosen), "the training runs lack their test metrics"
    if not screens or chromium_path() is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["mlflow", "server", "--backend-store-uri", "sqlite:///mlflow.db", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        query = urllib.parse.urlencode({"runs": json.dumps([r.info.run_id for r in chosen]),
                                        "experiments": json.dumps([exp.experiment_id])})
        dom = out_png.with_suffix(".dom.html")
        screenshot(f"http://127.0.0.1:{port}/#/compare-runs?{query}", out_png, 1600, 4200, 15000, dom=dom)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert non_trivial(out_png), f"{out_png.name} is blank"
    shown = visible_text(dom.read_text(encoding="utf-8"))
    wanted = ["Comparing 2 Runs", "run.method", "run.options.lr", "test/CIDEr-D", "val/CIDEr-D",
              *(r.info.run_name for r in chosen)]
    assert all(text in shown for text in wanted), [text for text in wanted if text not in shown]
    return out_png
