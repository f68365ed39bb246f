"""configs/recipes/*.yaml: one cited recipe per paper and dataset, laid over params.yaml.

Each recipe must validate, plan exactly its dataset's runs and tables (nothing of the demo), dry-run
under the real Snakemake (stand-in raw files), set every key its runs read (no demo value leaks in
through the --configfile merge), and cite a source for every run, model and objective value.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from caprl import params as params_mod, run_points
from caprl.workflow import plan as wp
from caprl.workflow.dvc import dvc_stages, layer_stages
from conftest import REPO

RECIPES_DIR = REPO / "configs" / "recipes"
RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))
IDS = [p.stem for p in RECIPES]
PARAMS = REPO / "params.yaml"

# A citation: a paper's section, equation, table, figure, appendix or algorithm; the PG-SPIDEr
# summary (no numbered sections); a file of a repository (authors' code, self-critical.pytorch);
# or, where none of them gives the value, the words "no source" saying so.
CITATION = re.compile(r"sec\. ?[\d'(]|eq\. ?\d|Table \d|Fig\. ?\d|Appendix|A\.[12]\b|Algorithm \d|\bsummary\b"
                      r"|[\w-]+\.(?:py|sh|yml|md)\b|\bno source\b")
CITED_SECTIONS = ("runs", "models", "objective_defaults", "objectives", "listener", "sweeps", "rewards", "train", "decode", "evaluate",
                  "features", "discriminative")


def read_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def recipe_dataset(recipe: dict[str, Any]) -> str:
    enabled = [name for name, spec in recipe["datasets"].items() if spec.get("enabled")]
    assert len(enabled) == 1, f"a recipe enables exactly one dataset, got {enabled}"
    return enabled[0]


def uncited_lines(text: str, sections: tuple[str, ...] = CITED_SECTIONS) -> list[str]:
    """The entries of ``sections`` that set a value without a comment citing a source.

    An entry is a line holding ``key: value`` (a model size, an objective option, a list), or a
    flow mapping (a run) with the lines it continues on until its braces close: one of its lines
    must cite. A line opening a nested mapping (``xe:``) and comment lines set nothing.
    """
    bad, section, entry, depth = [], None, [], 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.split(":", 1)[0].strip()
            continue
        if section not in sections:
            continue
        content, _, comment = line.partition("#")
        if depth == 0:
            key_value = re.match(r"\s*[\w.-]+:\s*(.*)$", content)
            if key_value is not None and key_value.group(1).strip() == "":
                continue
            entry = []
        entry.append((number, line.strip(), bool(CITATION.search(comment))))
        depth += content.count("{") - content.count("}")
        if depth == 0 and not any(cited for _, _, cited in entry):
            bad.append(f"line {entry[0][0]}: {entry[0][1]}")
    return bad


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[dict[str, Any], wp.Plan]]:
    """Recipe name -> (its loaded params, their plan), each built once."""
    out = {}
    for path in RECIPES:
        params = params_mod.load([PARAMS, path])
        out[path.stem] = (params, wp.build_plan(params))
    return out


def test_there_is_a_recipe_per_paper_and_dataset() -> None:
    assert IDS == ["actor_critic-coco", "pg_spider-coco", "psst-coco", "psst-flickr30k", "sle-coco", "sle-tgif",
                   "stackcap-coco", "transformer-coco", "updown-coco"]
    readme = (RECIPES_DIR / "README.md").read_text(encoding="utf-8")
    assert all(f"`{p.name}`" in readme for p in RECIPES)


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_a_recipe_plans_exactly_its_dataset_runs_and_tables(path: Path, loaded: dict) -> None:
    recipe = read_yaml(path)
    params, plan = loaded[path.stem]
    ds = recipe_dataset(recipe)
    assert params_mod.enabled_datasets(params) == [ds] and list(plan.datasets) == [ds]
    listed = recipe["datasets"][ds]["runs"]
    # every planned (or skipped) job is a run the recipe lists; every listed run is planned (swept: every point)
    trained = {(d, job.spec.source) for (d, _), job in plan.jobs.items() if not job.tuning}
    skipped = {(d, params["runs"][r].get(run_points.SWEPT_FROM, r)) for (d, r) in plan.skipped
               if run_points.TUNED_FROM not in params["runs"][r]}
    assert trained | skipped == {(ds, run) for run in listed}
    points = [r for r in params["datasets"][ds]["runs"] if run_points.TUNED_FROM not in params["runs"][r]]
    left_out = [r for (_, r) in plan.skipped if run_points.TUNED_FROM not in params["runs"][r]]
    assert sorted([job.run for job in plan.trained(ds)] + left_out) == sorted(points)
    for (_, run), reason in plan.skipped.items():  # only a reward that cannot run here (SPICE) leaves a run out
        assert "SPICE" in reason, (run, reason)
    assert plan.tables(ds) == recipe["datasets"][ds]["tables"]
    assert plan.table_files() and all(f.startswith(f"results/tables/{ds}_") for f in plan.table_files())


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_caprl_dvc_yaml_writes_a_train_stage_per_run_reading_the_recipe(path: Path, loaded: dict,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # `caprl dvc-yaml --params params.yaml configs/recipes/<name>.yaml` from the root
    files = ["params.yaml", f"configs/recipes/{path.name}"]
    plan = loaded[path.stem][1]
    stages = layer_stages(dvc_stages(plan), files)
    ds = recipe_dataset(read_yaml(path))
    train = {name: stage for name, stage in stages.items() if stage["cmd"].startswith("caprl train ")}
    assert len(train) == len(plan.trained(ds))
    assert all(f"--params {' '.join(files)} " in stage["cmd"] for stage in stages.values())
    assert all(any(isinstance(p, dict) and files[1] in p for p in stage["params"]) for stage in train.values())


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_a_recipe_sets_every_key_its_runs_read(path: Path) -> None:
    """What --configfile merges into params.yaml's demo values: the recipe's runs, models and
    objectives come out exactly as the recipe writes them, and every key they read is the recipe's."""
    recipe, demo = read_yaml(path), read_yaml(PARAMS)
    merged = params_mod.read([PARAMS, path])
    ds = recipe_dataset(recipe)
    assert recipe["datasets"]["synthetic"] == {"enabled": False}
    assert recipe["datasets"]["synthetic_video"] == {"enabled": False}
    assert set(recipe["datasets"][ds]["vocab"]) == {"min_count", "max_length"}
    runs = recipe["runs"]
    assert set(recipe["datasets"][ds]["runs"]) <= set(runs)
    for name, entry in runs.items():
        assert merged["runs"][name] == entry, f"runs.{name}: params.yaml's demo entry leaks into the recipe's"
        method, model = entry["method"], entry["model"]
        resolved = set(demo["objective_defaults"]) | set(demo["objectives"][method])  # what the method reads
        own = set(recipe["objectives"].get(method, {}))
        assert own <= resolved and resolved - own <= set(recipe.get("objective_defaults", {})), f"objectives.{method}"
        assert merged["models"][model] == recipe["models"].get(model), f"models.{model}: every size the recipe's"
    if any(entry["method"] == "listener" or "listener" in entry.get("init", {}) for entry in runs.values()):
        assert set(recipe["listener"]) == set(demo["listener"]), "listener: the listener's sizes"
    assert {"method", "beam_size", "max_length"} <= set(recipe["decode"])  # + any decoding option its source sets
    assert {"split", "metrics"} <= set(recipe["evaluate"]) and "batch_size" in recipe["train"]
    assert {"train", "evaluate"} <= set(recipe["resources"])


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_every_recipe_value_cites_its_source(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert uncited_lines(text) == []
    assert text.startswith("# Recipe:") and "snakemake --profile slurm all_tables --configfile" in text


def test_the_citation_check_finds_uncited_values() -> None:
    text = ("runs:\n"
            "  fc-xe: {method: xe, model: fc}   # Table 1\n"
            "  fc-scst: {method: scst, model: fc}\n"
            "  fc-c2f: {method: c2f, model: fc,    # sec. 'Implementation Details'\n"
            "           init: {model: fc-xe}}\n"
            "  fc-sll: {method: sll, model: fc,\n"
            "           init: {model: fc-xe}}      # no citation here\n"
            "objectives:\n"
            "  xe:                              # a heading\n"
            "    lr: 4.0e-4                     # a guess\n"
            "    epochs: 37                     # Stack-Captioning train.sh --max_epoch 37\n"
            "models:\n"
            "  fc:\n"
            "    hidden_size: 512               # sec. 4.1\n"
            "resources:\n"
            "  train: {runtime: 60}\n")
    assert uncited_lines(text) == ["line 3: fc-scst: {method: scst, model: fc}",
                                   "line 6: fc-sll: {method: sll, model: fc,",
                                   "line 10: lr: 4.0e-4                     # a guess"]


# -- the real Snakemake, one dry run per recipe (all at once: each is mostly imports) ----------------

def stand_in_checkout(work: Path, recipe: Path, plan: wp.Plan) -> None:
    """params.yaml, the Snakefile, workflow/, the claims configurations (a recipe names its paper's) and
    the recipe, plus empty files where the plan reads raw data."""
    (work / "configs" / "recipes").mkdir(parents=True)
    (work / "configs" / "claims").symlink_to(REPO / "configs" / "claims")
    shutil.copy(PARAMS, work / "params.yaml")
    shutil.copy(recipe, work / "configs" / "recipes" / recipe.name)
    for name in ("Snakefile", "workflow"):
        (work / name).symlink_to(REPO / name)
    for ds in plan.datasets.values():
        for raw in [*ds.raw_files, *ds.bottomup_tsv]:
            (work / raw).parent.mkdir(parents=True, exist_ok=True)
            (work / raw).touch()
        (work / ds.media_root).mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory: pytest.TempPathFactory, loaded: dict) -> dict[str, subprocess.CompletedProcess]:
    procs = {}
    for path in RECIPES:
        work = tmp_path_factory.mktemp(path.stem)
        stand_in_checkout(work, path, loaded[path.stem][1])
        cmd = ["snakemake", "-n", "--cores", "1", "all_tables", "--configfile", f"configs/recipes/{path.name}"]
        procs[path.stem] = (cmd, subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True))
    out = {}
    try:
        for name, (cmd, proc) in procs.items():
            stdout, _ = proc.communicate(timeout=300)
            out[name] = subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


TRAIN_JOB = re.compile(r"^rule train:\n(?:    .*\n)*?    wildcards: dataset=(\S+), run=(\S+)\n"
                       r"(?:    priority: [\d.]+\n)?    resources: .*?runtime=(\d+)", re.M)


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_snakemake_dry_runs_a_recipe_with_a_train_job_per_run(path: Path, loaded: dict, dry_runs: dict) -> None:
    proc = dry_runs[path.stem]
    assert proc.returncode == 0, proc.stdout[-4000:]
    plan = loaded[path.stem][1]
    ds = recipe_dataset(read_yaml(path))
    jobs = TRAIN_JOB.findall(proc.stdout)
    assert sorted(run for _, run, _ in jobs) == sorted(job.run for job in plan.trained(ds))
    assert {d for d, _, _ in jobs} == {ds}
    runtime = read_yaml(path)["resources"]["train"]["runtime"]
    assert {int(r) for _, _, r in jobs} == {runtime}  # the recipe's resources reach the jobs


def test_the_readmes_plan_and_dvc_commands_run_on_a_recipe(tmp_path: Path) -> None:
    """`caprl plan --params params.yaml configs/recipes/<name>.yaml` and `caprl dvc-yaml --params
    params.yaml configs/recipes/<name>.yaml` as the README writes them (real subprocesses, from the
    repository root): the plan costs every training job of the recipe, and dvc.yaml's stages read
    both files and name the recipe as their parameters' source."""
    recipe = "configs/recipes/actor_critic-coco.yaml"
    plan = subprocess.run(["caprl", "plan", "--params", "params.yaml", recipe, "--format", "json"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    report = __import__("json").loads(plan.stdout)
    trained = {job["job"] for job in report["jobs"] if job["rule"] == "train"}
    assert trained == {f"train coco/{run}" for run in read_yaml(REPO / recipe)["datasets"]["coco"]["runs"]}
    assert report["totals"]["hours"] > 1  # paper scale: hours, not the demo's minutes

    out = tmp_path / "dvc.yaml"
    dvc = subprocess.run(["caprl", "dvc-yaml", "--params", "params.yaml", recipe, "--out", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert dvc.returncode == 0, dvc.stderr[-3000:]
    stages = yaml.safe_load(out.read_text())["stages"]
    assert {name.split("-train-")[1] for name in stages if "-train-" in name} == \
        {run for run in read_yaml(REPO / recipe)["datasets"]["coco"]["runs"]}
    assert all(f"--params params.yaml {recipe} " in stage["cmd"] for stage in stages.values())
    check = subprocess.run(["caprl", "dvc-yaml", "--params", "params.yaml", recipe, "--out", str(out), "--check"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
