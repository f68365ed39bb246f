"""caprl.workflow.plan: the jobs both the Snakefile and dvc.yaml are made of (no tool run here)."""

from __future__ import annotations

import re

import pytest

import caprl.rewards
from caprl import params as params_mod, run_points
from caprl.workflow import plan as wp
from caprl.workflow.dvc import dvc_stages
from caprl.errors import CaprlError
from conftest import default_params, generated_dataset, two_dataset_params


def test_default_plan_trains_every_run_with_an_available_reward() -> None:
    params = run_points.expand_sweeps(default_params())  # a swept run is one run per point
    plan = wp.build_plan(params)
    assert list(plan.datasets) == ["synthetic", "synthetic_video"]
    trained = [job.run for job in plan.trained("synthetic")]
    video_only = {r for r, e in params["runs"].items() if e.get("datasets") == ["synthetic_video"]}
    assert video_only == {"fc_lstm_state-xe-video", "fc_lstm_state-sll-video", "fc_lstm_state-sll_me-video",
                          "fc_lstm_state-sll_sle-video"}
    listed_only = {r for r, e in params["runs"].items() if e.get("listed_only")}  # claims 006's: not the demo's
    assert listed_only == {"transformer-ppo_kl", "transformer-scst-clip_s_cider_d", "transformer-dico-clip_s_cider_d"}
    assert set(trained) | {run for ds, run in plan.skipped if ds == "synthetic"} == \
        set(params["runs"]) - video_only - listed_only
    # the video set trains only the runs it lists (datasets.synthetic_video.runs)
    video_runs = params["datasets"]["synthetic_video"]["runs"]
    assert [job.run for job in plan.trained("synthetic_video")] == [r for r in params["runs"] if r in video_runs]
    assert plan.job("synthetic_video", "fc_lstm_state-sll_sle-video").init == {
        "model": "runs/synthetic_video/fc_lstm_state-xe-video/best.pt"}
    job = plan.job("synthetic", "fc_lstm-pg_spider-bcmr")
    assert job.init == {"model": "runs/synthetic/fc_lstm-xe/best.pt"}
    assert job.init_args() == "--init model=runs/synthetic/fc_lstm-xe/best.pt"
    assert job.spec.options["reward"] == "bcmr" and job.spec.options["rollouts"] == 3
    assert plan.attention_job("synthetic").run == "stackcap-c2f"
    # paper 004's runs (every point of the lam / rho sweeps) hold a listener: ranked by retrieval
    retrieved = {job.run for job in plan.retrieved("synthetic")}
    assert "fc-psst_multinomial-lam0_5-rho1" in retrieved and "fc-frozen_speaker_mle" in retrieved
    assert "listener" not in retrieved and "fc-xe" not in retrieved and not plan.retrieved("synthetic_video")
    assert plan.job("synthetic", "fc-frozen_speaker_luo").init == {
        "model": "runs/synthetic/fc-luo2018-lam0_5/best.pt", "listener": "runs/synthetic/listener/best.pt"}
    assert plan.job("synthetic", "fc-st_gumbel-lam0_1").spec.decode["beam_size"] == 2
    assert plan.psst_pngs("synthetic") == ["results/figures/synthetic/psst_fig3.png",
                                           "results/figures/synthetic/psst_fig4.png"]
    video_tables = params["datasets"]["synthetic_video"]["tables"]
    assert len(plan.table_files()) == 3 * (len(params["tables"]) + len(video_tables))
    assert "results/tables/synthetic_video_sle_table3.md" in plan.table_files("synthetic_video")
    assert not any("stackcap" in f for f in plan.table_files("synthetic_video"))
    assert plan.scores("synthetic")[-1] == "results/synthetic/most-frequent/scores.json"


def test_the_listener_run_gets_a_gold_retrieval_job_and_the_tables_read_it() -> None:
    """The objective's ``gold_retrieval`` decides (ListenerPretraining), not the method's name."""
    from caprl.objectives import OBJECTIVES

    params = run_points.expand_sweeps(default_params())
    params["runs"]["embedding"] = {"method": "listener", "model": "fc", "datasets": ["synthetic"]}
    plan = wp.build_plan(params)
    assert OBJECTIVES.get("listener").gold_retrieval and not OBJECTIVES.get("psst_multinomial").gold_retrieval
    assert [job.run for job in plan.gold_retrieved("synthetic")] == ["listener", "embedding"]
    assert not plan.gold_retrieved("synthetic_video")  # no listener run trains on it
    assert not any(job.gold_retrieval for job in plan.jobs.values() if job.captioner)
    assert plan.job("synthetic", "listener").gold_retrieval and not plan.job("synthetic", "listener").retrieval
    files = ["results/synthetic/listener/retrieval.json", "results/synthetic/embedding/retrieval.json"]
    assert plan.gold_retrieval_files("synthetic") == files
    assert plan.table_inputs("synthetic") == plan.scores("synthetic") + plan.retrieval_files("synthetic") + files
    stages = dvc_stages(plan)
    gold = stages["synthetic-gold_retrieval-listener"]
    assert " --gold " in gold["cmd"] and "--captions" not in gold["cmd"] and gold["outs"] == [files[0]]
    assert "runs/synthetic/listener/best.pt" in gold["deps"] and gold["params"] == ["evaluate.split", "listener"]
    assert not any(name.startswith("synthetic-gold_retrieval-") and not name.endswith(("listener", "embedding"))
                   for name in stages)
    assert "synthetic-retrieval-listener" not in stages and "synthetic-evaluate-listener" not in stages
    assert set(files) <= set(stages["synthetic-table-psst_points"]["deps"])
    assert "listener" in stages["synthetic-train-listener"]["params"]  # its listener: sizes


def test_a_captioner_with_a_listener_cannot_also_take_the_gold_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl.objectives import OBJECTIVES

    monkeypatch.setattr(OBJECTIVES.get("psst_multinomial"), "gold_retrieval", True)
    with pytest.raises(CaprlError, match=r"runs\.fc-psst_multinomial.*\.method: objective psst_multinomial is a "
                                         "captioner with a listener"):
        wp.build_plan(default_params())


def test_a_run_whose_reward_is_unavailable_is_skipped_with_its_dependents(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(name: str, params: dict) -> str | None:
        return "no METEOR here" if name == "bcmr" else None

    monkeypatch.setattr(caprl.rewards, "reward_unavailable_reason", unavailable)
    params = default_params()
    params["runs"]["fc-after-bcmr"] = {"method": "scst", "model": "fc_lstm",
                                       "init": {"model": "fc_lstm-pg_spider-bcmr"}}
    plan = wp.build_plan(params)
    assert plan.skipped_runs("synthetic") == {
        "fc_lstm-pg_spider-bcmr": "no METEOR here",
        "fc-after-bcmr": "starts from run fc_lstm-pg_spider-bcmr, which is skipped",
    }
    assert wp.skipped_runs(params, "synthetic") == plan.skipped_runs("synthetic")
    with pytest.raises(CaprlError, match="no METEOR here"):
        plan.job("synthetic", "fc_lstm-pg_spider-bcmr")
    stages = dvc_stages(plan)
    assert ("synthetic-train-fc_lstm-pg_spider-bcmr" not in stages
            and "synthetic-train-fc_lstm-pg_spider-cider_d" in stages)


def test_only_captioner_runs_are_evaluated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wp, "_roles", lambda run, method: (method != "c2f", False, False))
    plan = wp.build_plan(default_params())
    evaluated = {job.run for job in plan.evaluated("synthetic")}
    assert "stackcap-c2f" not in evaluated and "stackcap-xe" in evaluated
    assert "results/synthetic/stackcap-c2f/scores.json" not in plan.scores("synthetic")
    assert "synthetic-evaluate-stackcap-c2f" not in dvc_stages(plan)
    assert "synthetic-train-stackcap-c2f" in dvc_stages(plan)


def test_runs_follow_their_datasets() -> None:
    params = two_dataset_params()
    params["runs"]["fc-scst"]["datasets"] = ["shapes_b"]
    plan = wp.build_plan(params)
    assert list(plan.datasets) == ["synthetic", "shapes_b"]
    assert ("shapes_b", "fc-scst") in plan.jobs and ("synthetic", "fc-scst") not in plan.jobs
    assert plan.job("shapes_b", "fc-scst").init == {"model": "runs/shapes_b/fc-xe/best.pt"}
    assert plan.datasets["shapes_b"].features == "data/shapes_b/features_patches.h5"
    assert {f.split("/")[-1].split("_main")[0] for f in plan.table_files() if "_main." in f} == {
        "synthetic", "shapes_b"}


def test_an_enabled_tgif_dataset_is_planned_and_its_raw_file_asked_for() -> None:
    """TGIF reads (format tgif: GIFs probed at prepare, per-frame features): enabling it plans it."""
    params = default_params()
    params["datasets"]["tgif"]["enabled"] = True
    plan = wp.build_plan(params)
    assert "tgif" in plan.datasets
    assert plan.datasets["tgif"].features == "data/tgif/features_resnet152.h5"
    assert any(why.startswith("datasets.tgif.raw: data/raw/tgif/tgif-v1.0.tsv does not exist")
               and "split lists" in why for why in plan.missing_raw())


def test_a_dataset_lists_its_runs_and_a_bad_name_is_an_error() -> None:
    params = default_params()
    params["datasets"]["synthetic_video"]["runs"] = ["fc-xe", "fc-scst"]
    plan = wp.build_plan(params)
    assert [job.run for job in plan.trained("synthetic_video")] == ["fc-xe", "fc-scst"]
    params["datasets"]["synthetic_video"]["runs"] = ["fc-xe", "fc-sl"]
    with pytest.raises(CaprlError, match="datasets.synthetic_video.runs: 'fc-sl' is not a run"):
        wp.build_plan(params)
    params["datasets"]["synthetic_video"]["runs"] = ["fc-scst"]  # its init run does not train there
    with pytest.raises(CaprlError, match="runs.fc-scst.init.model: run 'fc-xe' does not train on synthetic_video"):
        wp.build_plan(params)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p["datasets"].__setitem__("b", {**generated_dataset("b"), "raw": "raw/b.json"}),
         r"datasets\.b\.raw: a generated dataset .* data/raw/b/dataset_b\.json"),
        (lambda p: p["runs"]["fc-scst"].__setitem__("init", {"model": "gone"}), r"runs\.fc-scst\.init\.model"),
    ],
)
def test_bad_plans_name_the_key(edit, expected: str) -> None:
    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=expected):
        wp.build_plan(params)


@pytest.mark.parametrize("edit, expected", [
    (lambda p: p["runs"]["fc_lstm_state-sll_sle"]["options"].__setitem__("diversity", "mean"),
     "runs.fc_lstm_state-sll_sle.options.diversity: expected one of leave_one_out, pairwise, got 'mean'"),
    (lambda p: p["objectives"]["psst_gumbel"].__setitem__("variant", "soft"),
     "options.variant: expected one of code, paper, got 'soft'"),
    (lambda p: p["objectives"]["pg_spider"].__setitem__("rollout_mode", "greedy"),
     "options.rollout_mode: expected one of policy, eval, got 'greedy'"),
    (lambda p: p["objectives"]["xe"].__setitem__("n_samples", 5), "runs.fc-xe.options: unknown option(s) n_samples"),
    (lambda p: p["decode"].__setitem__("method", "nucleus"), "decode.method: unknown decoder 'nucleus'; registered:"),
    (lambda p: p["runs"]["fc-scst"].__setitem__("decode", {"groups": 2, "diversity_lambda": 0.5, "beam_size": 3}),
     "runs.fc-scst.decode.groups"),
    (lambda p: p["decode"].__setitem__("top_p", 0.9), "decode.top_p: 0.9, but the beam decoder"),
    (lambda p: p["datasets"]["synthetic"].__setitem__("backbone", "vit"),
     "datasets.synthetic.backbone: unknown backbone 'vit'; registered: clip, patches, resnet101, resnet152, tinycnn"),
])
def test_the_plan_checks_each_runs_options_and_names_against_their_registries(edit, expected: str) -> None:
    """Per-method options (the objective's Options: names, types, choices) and the names a registry
    holds (decoders, backbones) are refused when the DAG is planned, in the words `caprl train` uses;
    the registries are the one list of what a name may be (the schema only says 'a string')."""
    params = default_params()
    edit(params)
    with pytest.raises(CaprlError, match=re.escape(expected)):
        wp.build_plan(params)
