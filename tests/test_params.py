"""params.yaml validation: unknown keys and wrong types are errors naming the key."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from caprl import params as params_mod, run_points
from caprl.errors import CaprlError
from conftest import REPO, default_params


def test_repository_params_are_valid() -> None:
    params_mod.load(REPO / "params.yaml")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p["train"].__setitem__("batch_sise", 5), "train.batch_sise"),
        (lambda p: p["train"].__setitem__("batch_size", "fifty"), "train.batch_size"),
        (lambda p: p.__setitem__("extra_section", {}), "extra_section"),
        (lambda p: p["models"]["fc"].__setitem__("hiden_size", 3), "models.fc.hiden_size"),
        (lambda p: p["objectives"]["scst"].__setitem__("lr", "fast"), "objectives.scst.lr"),
        (lambda p: p["objectives"]["scst"].__setitem__("lr_decay_every", 1.5), "objectives.scst.lr_decay_every"),
        (lambda p: p["objectives"]["actor_critic"].__setitem__("lr_decay_rate", 0),
         "objectives.actor_critic.lr_decay_rate"),
        (lambda p: p["objective_defaults"].pop("lr_decay_rate"), "objective_defaults"),
        (lambda p: p["objective_defaults"].__setitem__("n_samples", 5), "objective_defaults.n_samples"),
    ],
)
def test_bad_params_name_the_key(write_params, edit, expected: str) -> None:
    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=expected.replace(".", r"\.")):
        params_mod.load(write_params(params))


def test_every_objective_option_has_its_default_in_params() -> None:
    """Each method's entry under objectives: lists exactly its Options' fields (the step decay's
    included): no option without a default in params.yaml, no key the method would refuse."""
    import dataclasses

    from caprl.objectives import OBJECTIVES

    objectives = default_params()["objectives"]
    for method in [m for m in OBJECTIVES if not m.startswith("test_")]:  # a test may register one for a while
        fields = {f.name for f in dataclasses.fields(OBJECTIVES.get(method).Options)}
        assert set(objectives[method]) == fields, method
        assert {"lr_decay_every", "lr_decay_rate"} <= fields


def test_a_method_gets_the_shared_defaults_unless_it_sets_its_own(write_params) -> None:
    """objective_defaults: fills every method's options that it leaves out; the method's own value,
    then a run's options, win."""
    params = default_params()
    params["objectives"]["scst"].pop("lr_decay_every")
    params["objectives"]["scst"].pop("lr_decay_rate")
    params["objective_defaults"] = {"lr_decay_every": 4, "lr_decay_rate": 0.5}
    params["runs"]["fc-scst"]["options"]["lr_decay_rate"] = 0.7
    loaded = params_mod.load(write_params(params))
    assert {k: loaded["objectives"]["scst"][k] for k in ("lr_decay_every", "lr_decay_rate")} == \
        {"lr_decay_every": 4, "lr_decay_rate": 0.5}
    assert params_mod.run_spec(loaded, "fc-scst").options["lr_decay_rate"] == 0.7
    assert loaded["objectives"]["actor_critic"]["lr_decay_every"] == 2  # its own (paper 003: every 2 epochs)


def test_numbers_written_without_a_dot_are_numbers(tmp_path) -> None:
    """``1e-08`` (how JSON and Python print 1e-8; PyYAML's YAML 1.1 reads it as a string) is a float."""
    import json

    path = tmp_path / "params.yaml"
    path.write_text(json.dumps(default_params()))  # JSON is YAML: adam_eps 1e-08
    loaded = params_mod.load(path)
    assert loaded["objective_defaults"]["adam_eps"] == 1e-8
    (tmp_path / "more.yaml").write_text("objective_defaults: {adam_eps: 1e-9}\nseed: 7\nnote: '1e-3'\n")
    merged = params_mod.read([path, tmp_path / "more.yaml"])
    assert merged["objective_defaults"]["adam_eps"] == 1e-9 and merged["seed"] == 7


def test_stage_refuses_bad_params_and_writes_nothing(write_params, tmp_path) -> None:
    params = default_params()
    params["vocab"]["min_count"] = "five"
    path = write_params(params)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "caprl", "synthesize", "--params", str(path), "--dataset", "synthetic",
         "--out-json", str(out),
         "--image-dir", str(tmp_path / "images")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "vocab.min_count" in proc.stderr
    assert not out.exists() and not (tmp_path / "images").exists()


def test_snakemake_validates_before_any_job(write_params, tmp_path) -> None:
    params = default_params()
    params["decode"]["beam"] = 3
    write_params(params)
    for name in ("Snakefile", "workflow"):
        (tmp_path / name).symlink_to(REPO / name)
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "all_tables"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "beam" in proc.stdout + proc.stderr


def test_missing_real_data_says_where_and_how(write_params, tmp_path) -> None:
    params = default_params()
    params["datasets"]["coco"]["enabled"] = True
    write_params(params)
    proc, out = snakemake_dry_run(tmp_path)
    assert proc.returncode != 0
    assert "datasets.coco.raw: data/raw/coco/dataset_coco.json does not exist" in out
    assert "Karpathy" in out and "docs/real-data.md" in out
    assert not (tmp_path / "data").exists()


# -- runs, datasets: cross-references ------------------------------------------------------

def test_run_spec_merges_options_over_the_method_defaults() -> None:
    params = default_params()
    spec = params_mod.run_spec(params, "fc_lstm-pg_spider-bcmr")
    assert spec == params_mod.RunSpec(
        name="fc_lstm-pg_spider-bcmr", method="pg_spider", model="fc_lstm",
        options={**params["objectives"]["pg_spider"], **params["runs"]["fc_lstm-pg_spider-bcmr"]["options"]},
        init={"model": "fc_lstm-xe"},
        datasets=["synthetic"], decode=params["decode"], source="fc_lstm-pg_spider-bcmr")
    xe = params_mod.run_spec(params, "fc-xe").options
    assert xe == {**params["objectives"]["xe"], **params["runs"]["fc-xe"]["options"]} and xe["epochs"] == 36
    # paper 002's runs read its reward text from their objectives (objectives.sll, sll_sle), not a run option
    assert {params_mod.run_spec(params, run).options["reward"] for run in params["runs"]
            if params["runs"][run]["method"] in ("sll", "sll_sle")} == {"cider_d_noeos"}
    with pytest.raises(CaprlError, match="unknown run 'nope'"):
        params_mod.run_spec(params, "nope")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p["runs"]["fc-xe"].__setitem__("epochs", 3), r"unknown key\(s\) runs\.fc-xe\.epochs"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("init", {"model": "fc-xx"}),
         r"runs\.fc-scst\.init\.model: no run named 'fc-xx'"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("options", {"n_sample": 3}),
         r"runs\.fc-scst\.options.*n_sample"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("options", {"temperature": 0.5, "rollouts": 2}),
         r"runs\.fc-scst\.options\.rollouts: objectives\.scst has no option"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("method", "ppo"), r"runs\.fc-scst\.method: 'ppo'"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("model", "vit"), r"runs\.fc-scst\.model: 'vit'"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("options", {"reward": "rouge"}),
         r"runs\.fc-scst\.options\.reward: 'rouge' is not a reward"),
        (lambda p: p["runs"]["fc-xe"].__setitem__("datasets", ["imagenet"]),
         r"runs\.fc-xe\.datasets: no dataset named 'imagenet'"),
        (lambda p: p["runs"]["fc-xe"].__setitem__("init", {"model": "fc-scst"}), r"start from each other"),
        (lambda p: p["datasets"]["synthetic"].__setitem__("format", "coco"), r"datasets\.synthetic\.format"),
        (lambda p: p["datasets"]["synthetic_video"].__setitem__("runs", ["fc-xe", "nope"]),
         r"datasets\.synthetic_video\.runs: 'nope' is not a run"),
        (lambda p: [p["datasets"][ds].__setitem__("enabled", False) for ds in p["datasets"]],
         r"no dataset has enabled: true"),
        (lambda p: p["datasets"]["synthetic"].__setitem__("backbone", "vit"), r"datasets\.synthetic\.backbone"),
    ],
)
def test_bad_references_name_the_key(write_params, edit, expected: str) -> None:
    """Checked when params.yaml is loaded, or at the latest by the workflow plan (a dataset against its
    reader: caprl.data.readers.check_datasets), which Snakemake and DVC build before any job runs."""
    from caprl.workflow.plan import build_plan

    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=expected):
        build_plan(params_mod.load(write_params(params)))


def test_an_init_run_must_train_on_the_same_datasets(write_params) -> None:
    params = default_params()
    params["datasets"]["coco"]["enabled"] = True
    params["runs"]["fc-xe"]["datasets"] = ["synthetic"]
    with pytest.raises(CaprlError, match=r"runs\.fc-scst\.init\.model: run 'fc-xe' does not train on coco"):
        params_mod.load(write_params(params))


def test_dataset_spec_resolves_the_generator_settings() -> None:
    params = default_params()
    params["datasets"]["synthetic"]["synthetic"] = {"n_train": 7}
    spec = params_mod.dataset_spec(params, "synthetic")
    assert spec["name"] == "synthetic" and spec["backbone"] == "tinycnn"
    assert spec["synthetic"] == {**params["synthetic"], "n_train": 7}
    with pytest.raises(CaprlError, match=r"datasets\.nope: no such dataset"):
        params_mod.dataset_spec(params, "nope")


def test_unknown_run_key_fails_snakemake_before_any_job(write_params, tmp_path) -> None:
    params = default_params()
    params["runs"]["fc-scst"]["init"] = {"model": "fc-xx"}
    write_params(params)
    proc, out = snakemake_dry_run(tmp_path)
    assert proc.returncode != 0
    assert "runs.fc-scst.init.model" in out and "MissingInput" not in out


def snakemake_dry_run(workdir):
    """``snakemake -n all_tables`` in ``workdir`` (its params.yaml, the repository's workflow)."""
    for name in ("Snakefile", "workflow"):
        (workdir / name).symlink_to(REPO / name)
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "all_tables"], capture_output=True, text=True,
                          cwd=workdir)
    return proc, proc.stdout + proc.stderr


# -- sweeps: one run per point --------------------------------------------------------------

def test_a_sweep_expands_into_one_run_per_point_of_the_product() -> None:
    params = default_params()
    params["sweeps"] = {"lam": [0.01, 0.0025]}
    params["runs"] = {"fc-xe": {"method": "xe", "model": "fc"},
                      "listener": {"method": "listener", "model": "fc"},
                      "fc-psst_multinomial": {"method": "psst_multinomial", "model": "fc",
                                              "init": {"model": "fc-xe", "listener": "listener"},
                                              "sweep": {"lam": "lam", "rho": [0.25, 1.0]}, "decode": {"beam_size": 2}}}
    params["datasets"]["synthetic"]["runs"] = ["fc-xe", "listener", "fc-psst_multinomial"]
    params["datasets"]["synthetic_video"]["enabled"] = False
    out = run_points.expand_sweeps(params)
    points = [r for r in out["runs"] if r.startswith("fc-psst")]
    assert points == ["fc-psst_multinomial-lam0_01-rho0_25", "fc-psst_multinomial-lam0_01-rho1",
                      "fc-psst_multinomial-lam0_0025-rho0_25", "fc-psst_multinomial-lam0_0025-rho1"]
    assert out["datasets"]["synthetic"]["runs"] == ["fc-xe", "listener", *points]
    spec = params_mod.run_spec(out, points[1])
    assert spec.options["lam"] == 0.01 and spec.options["rho"] == 1.0 and spec.source == "fc-psst_multinomial"
    assert spec.decode == {**params["decode"], "beam_size": 2} and spec.init == {"model": "fc-xe", "listener": "listener"}
    assert run_points.expand_sweeps(out) == out  # idempotent
    params_mod.check(out)


def test_a_sweep_naming_an_unknown_list_or_option_is_an_error() -> None:
    params = default_params()
    params["runs"]["fc-scst"]["sweep"] = {"lr": "nope"}
    with pytest.raises(CaprlError, match="runs.fc-scst.sweep.lr: 'nope' is not a list under sweeps"):
        run_points.expand_sweeps(params)
    params["runs"]["fc-scst"]["sweep"] = {"alpha": [0.5]}
    with pytest.raises(CaprlError, match="objectives.scst has no option 'alpha'"):
        params_mod.check(run_points.expand_sweeps(params))


def test_an_evaluation_job_reads_every_evaluate_setting_through_its_typed_settings() -> None:
    """``caprl evaluate`` resolves params once into :class:`EvalSettings`: every key of the schema's
    ``evaluate:`` is a field (clip_score: its own module's), the schema requires each one it reads
    without a default (evaluate.greedy too), and the settings are params.yaml's values."""
    import dataclasses

    from caprl.evaluation.settings import EvalSettings

    schema = yaml.safe_load((REPO / "workflow/schemas/params.schema.yaml").read_text())
    evaluate = schema["properties"]["evaluate"]
    fields = {f.name for f in dataclasses.fields(EvalSettings)}
    assert set(evaluate["properties"]) - {"clip_score"} <= fields
    assert set(evaluate["required"]) == set(evaluate["properties"]) - {"lookahead", "clip_score"}
    params = default_params()
    settings = EvalSettings.from_params(params)
    assert settings.greedy is params["evaluate"]["greedy"] and settings.lookahead is not None
    assert (settings.lookahead.lam, settings.diversity.beams, settings.max_length) == (
        params["evaluate"]["lookahead"]["lam"], params["evaluate"]["diversity"]["beams"], params["decode"]["max_length"])
    del params["evaluate"]["greedy"]
    with pytest.raises(CaprlError, match="evaluate.*greedy"):
        params_mod.validate(params, REPO / params_mod.SCHEMA_RELPATH)


def test_a_training_job_reads_every_train_setting_through_its_typed_settings() -> None:
    """``caprl train`` resolves params once into :class:`TrainSettings`: every key of the schema's
    ``train:`` is a field, the schema requires each, the loop's settings come from it, and a
    changed setting reaches the job (not a default hidden in the code)."""
    import dataclasses

    from caprl.training.loop import LoopConfig
    from caprl.training.settings import TrainSettings

    schema = yaml.safe_load((REPO / "workflow/schemas/params.schema.yaml").read_text())
    train = schema["properties"]["train"]
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    assert set(train["properties"]) <= fields
    assert set(train["required"]) == set(train["properties"])
    assert {f.name for f in dataclasses.fields(LoopConfig)} - {"epochs"} <= fields  # the loop's: all from here
    params = default_params()
    params["train"].update(batch_size=7, patience=3, grad_clip=0.5, num_threads=0)
    params["loading"]["prefetch"] = 4
    settings = TrainSettings.from_params(params, "synthetic", "topdown-scst")
    loop = settings.loop(epochs=2)
    assert (loop.epochs, loop.batch_size, loop.patience, loop.grad_clip, loop.prefetch) == (2, 7, 3, 0.5, 4)
    assert settings.num_threads == 1  # 0 threads: torch's at least one
    assert (settings.model.arch, settings.model.sizes["hidden_size"]) == (
        "topdown", params["models"]["topdown"]["hidden_size"])
    assert settings.spec.init == {"model": "topdown-xe"} and settings.sections["reward"] == params["rewards"]["cider_d"]
    params["runs"]["topdown-scst"]["model"] = "nowhere"
    with pytest.raises(CaprlError, match="runs.topdown-scst.model"):
        TrainSettings.from_params(params, "synthetic", "topdown-scst")


def test_the_schemas_enums_are_the_codes_own_lists() -> None:
    """Where the schema lists allowed values, they are the ones the code knows (one source of truth):
    a value added to a registry or tuple and not to the schema (or the reverse) fails here."""
    from caprl.metrics.embeddings import EMBEDDINGS
    from caprl.metrics.official import METRICS
    from caprl.models.fc import CELLS
    from caprl.training.settings import VALIDATE_WITH

    schema = yaml.safe_load((REPO / "workflow/schemas/params.schema.yaml").read_text())
    train = schema["properties"]["train"]["properties"]
    evaluate = schema["properties"]["evaluate"]["properties"]
    assert train["validate_with"]["enum"] == list(VALIDATE_WITH)
    assert evaluate["metrics"]["items"]["enum"] == list(METRICS)
    assert set(schema["$defs"]["clip_score"]["properties"]["embedding"]["enum"]) == {*EMBEDDINGS, "none"}
    cell = next(v["properties"]["cell"] for v in _walk(schema) if isinstance(v, dict)
                and "cell" in v.get("properties", {}))
    assert cell["enum"] == list(CELLS)


def _walk(node: Any) -> Any:
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def test_the_schemas_objective_options_are_the_methods_own_fields() -> None:
    """``$defs.objective_options`` (the types and ranges the schema checks first) holds exactly the
    options some method's ``Options`` dataclass declares; which method takes which is checked per
    method by that dataclass at plan time (``run_checks.options_problem``), so an option of one
    method set on another is refused by ``snakemake -n`` naming the run and the key."""
    import dataclasses

    from caprl.objectives import OBJECTIVES
    from caprl.objectives.run_checks import options_problem

    schema = yaml.safe_load((REPO / "workflow/schemas/params.schema.yaml").read_text())
    declared = {f.name for method in OBJECTIVES for f in dataclasses.fields(OBJECTIVES.get(method).Options)}
    assert set(schema["$defs"]["objective_options"]["properties"]) == declared

    params = params_mod.resolve(default_params())
    xe = dict(params["objectives"]["xe"])
    assert options_problem("fc-xe", "xe", xe) is None
    problem = options_problem("fc-xe", "xe", {**xe, "rho": 0.25})  # PSST's option on an XE run
    assert problem is not None and "runs.fc-xe.options" in problem and "rho" in problem


def test_params_yaml_stays_a_ten_minute_read() -> None:
    """The first file a user opens stays under 25 KB (issue 38): a value and a short comment each;
    the long explanations live in docs/params.md."""
    assert len((REPO / "params.yaml").read_bytes()) < 25_000


def test_a_listed_only_run_trains_only_where_it_is_named() -> None:
    """``listed_only: true`` (claims 006's runs): no dataset builds the run by default, one whose
    runs: lists it does, its tuning points train where the run could, and a claims config naming
    it trains it (the flag dropped)."""
    from caprl.claims import configs

    base = default_params()
    base["runs"]["transformer-ppo_kl"]["listed_only"] = True
    params = params_mod.resolve({**base, "tuning": {"budget": 3, "runs": {"transformer-ppo_kl": {"lr": "lr"}}}})
    assert params_mod.run_spec(params, "transformer-ppo_kl").datasets == []
    assert params_mod.run_spec(params, "transformer-grpo").datasets == ["synthetic"]
    points = [r for r, e in params["runs"].items() if e.get(run_points.TUNED_FROM) == "transformer-ppo_kl"]
    assert len(points) == 3 and all(params_mod.run_spec(params, p).datasets == ["synthetic"] for p in points)
    assert params_mod.tuning_datasets(params, "transformer-ppo_kl") == ["synthetic"]

    listed = {**base, "datasets": {**base["datasets"], "synthetic": {**base["datasets"]["synthetic"],
                                                                      "runs": ["transformer-xe", "transformer-ppo_kl"]}}}
    assert params_mod.run_spec(params_mod.resolve(listed), "transformer-ppo_kl").datasets == ["synthetic"]

    config = {"paper": "9", "demo": {"runs": ["transformer-xe", "transformer-ppo_kl"]}, "claims": []}
    seed = configs.seed_params(base, config, 1)
    assert "listed_only" not in seed["runs"]["transformer-ppo_kl"]
    assert params_mod.run_spec(params_mod.resolve(seed), "transformer-ppo_kl").datasets == ["synthetic"]
