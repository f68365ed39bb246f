"""The SLURM profile (workflow/profiles/slurm) against a real SLURM cluster on this machine.

tests/slurm/start_cluster.sh installs SLURM from Debian when it is missing and starts
munged, slurmctld and slurmd: one node, two fake GPUs (gres), one partition.
stop_cluster.sh stops those daemons by PID. The workflow runs with the real profile, its
four cluster values set for this cluster, followed by tests/slurm/profile (status checks
every 2 s instead of 40, SLURM logs kept, no retries).

No accounting database (slurmdbd + MariaDB) is started: without one `sacct` fails, the
case in which the plugin's default status command hangs, and which the profile's
`slurm-status-command: squeue` has to survive; it also keeps the install to four small
packages. squeue and `scontrol show job` keep a finished job for MinJobAge (3600 s on
this cluster): the assertions read each job's state, exit code, partition, time limit,
memory and GPUs there, and slurmctld's log confirms each allocation and completion.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
import yte

from caprl import params as params_mod
from caprl.workflow.plan import CPU_BACKBONES, build_plan
from conftest import REPO, TINY, generated_dataset

# the jobs run on the cluster, in their own processes (not in this worker's job server)
pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.usefixtures("jobs_by_themselves")]

SLURM_DIR = REPO / "tests" / "slurm"
PROFILE = REPO / "workflow" / "profiles" / "slurm" / "config.yaml"
TEST_PROFILE = SLURM_DIR / "profile"
# The real profile's cluster values (its __variables__), for the test cluster.
CLUSTER = {"partition": "ci", "account": "", "gpu_model": "fakegpu", "cpus_per_gpu": 1}
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")
# `timeout -s INT` (SIGINT makes snakemake cancel its jobs and exit): a hang's bound, not a speed
# check; the reduced run takes 4-9 minutes with the other tests' load on this 2-core machine
PIPELINE_LIMIT_S = 1500
RESUME_LIMIT_S = 240
# How slurmctld's log says it started a job: the main scheduler allocates it, or the backfill
# scheduler starts it (either may, depending on timing).
JOB_STARTED = ("sched: Allocate JobId={id} ", "sched/backfill: _start_job: Started JobId={id} ")


# -- the cluster -------------------------------------------------------------------------

def daemon_pids() -> dict[int, str]:
    """PID -> name of every running SLURM or munge daemon (and job step daemon)."""
    found = {}
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:
            continue
        if name in DAEMONS:
            found[int(comm.parent.name)] = name
    return found


@dataclass
class Cluster:
    state: Path
    preexisting: dict[int, str]   # daemons that ran before the cluster started: not ours

    def stop(self) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SLURM_DIR / "stop_cluster.sh"), str(self.state)],
                              capture_output=True, text=True, timeout=120)

    def log(self) -> str:
        return (self.state / "log" / "slurmctld.log").read_text()


def cluster_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI" and not k.startswith("SLURM_")}
    env.update(CI_PARTITION=CLUSTER["partition"], CI_GPU_TYPE=CLUSTER["gpu_model"])
    return env


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("needs root: tests/slurm/start_cluster.sh installs SLURM with apt-get and starts its daemons")
    cluster = Cluster(tmp_path_factory.mktemp("slurm-cluster"), daemon_pids())
    started = time.monotonic()
    try:
        proc = subprocess.run(["bash", str(SLURM_DIR / "start_cluster.sh"), str(cluster.state)],
                              capture_output=True, text=True, timeout=600, env=cluster_env())
        if proc.returncode == 3:  # no apt-get, or apt-get could not install the packages
            pytest.skip(f"no SLURM cluster: {proc.stderr.strip()}")
        assert proc.returncode == 0, f"start_cluster.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        print(f"{proc.stdout}cluster started in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        cluster.stop()


# -- profiles, workflow copies, snakemake ------------------------------------------------

def render_profile(dest: Path) -> dict[str, Any]:
    """Write the real profile with the test cluster's values to dest/config.yaml; return it
    as snakemake reads it (YTE expressions evaluated)."""
    profile = yaml.safe_load(PROFILE.read_text())
    assert set(profile["__variables__"]) == set(CLUSTER), "the profile's cluster values changed: update CLUSTER"
    profile["__variables__"] = dict(CLUSTER)
    text = yaml.safe_dump(profile, sort_keys=False)
    dest.mkdir(parents=True)
    (dest / "config.yaml").write_text(text)
    return yte.process_yaml(text, require_use_yte=True)


def rule_resources(profile: dict[str, Any], params: dict[str, Any], rule: str) -> dict[str, Any]:
    """What a job of `rule` should ask for: the profile's cluster settings, then params.yaml's
    `resources:` (runtime, memory; the rules read them, a recipe may set its own)."""
    own = {**params["resources"]["default"], **params["resources"].get(re.sub(r"^curves_.*", "curves", rule), {})}
    own.pop("gpus", None)
    return {**profile["default-resources"], **profile["set-resources"].get(rule, {}), **own}


def copy_workflow(dst: Path) -> Path:
    shutil.copy(REPO / "Snakefile", dst / "Snakefile")
    shutil.copytree(REPO / "workflow", dst / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def snakemake(work: Path, profile_dir: Path, args: list[str], limit_s: int) -> subprocess.Popen:
    """Start `timeout -s INT <limit> snakemake --profile <real> --profile <test> ...` in work;
    its output goes to work/snakemake.log."""
    cmd = ["timeout", "-s", "INT", str(limit_s), "snakemake", "--profile", str(profile_dir),
           "--profile", str(TEST_PROFILE), "--verbose", *args]
    with (work / "snakemake.log").open("w") as out:
        return subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT, env=cluster_env())


def finish(proc: subprocess.Popen, work: Path) -> str:
    proc.wait()
    log = (work / "snakemake.log").read_text()
    assert proc.returncode == 0, f"snakemake exited {proc.returncode}:\n{log[-8000:]}\n{slurm_logs_tail(work)}"
    return log


def slurm_logs_tail(work: Path) -> str:
    return "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in sorted(work.glob(".snakemake/slurm_logs/**/*.log")))


def slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=30).stdout


def submissions(log: str) -> dict[str, tuple[str, str]]:
    """SLURM job id -> (snakemake job id, its log folder: rule_<rule> or group_<group>), from
    snakemake's 'Job 3 has been submitted with SLURM jobid 14 (log: .../slurm_logs/rule_train/fc-xe/14.log)'
    lines (a group job's id is a uuid, its log under slurm_logs/group_<group>/)."""
    found = re.findall(r"Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", log)
    return {slurm_id: (jobid, re.search(r"slurm_logs/((?:rule|group)_[^/]+)/", path).group(1))
            for jobid, slurm_id, path in found}


def members(work: Path, folder: str, slurm_id: str) -> list[str]:
    """The rules a SLURM job ran: its own (rule_<rule>), or every job of its group, from its log."""
    if folder.startswith("rule_"):
        return [folder.removeprefix("rule_")]
    text = next(work.glob(f".snakemake/slurm_logs/{folder}/**/{slurm_id}.log")).read_text()
    return list(dict.fromkeys(re.findall(r"^\s*(?:local)?rule (\w+):$", text, flags=re.M)))  # each job once


def group_bounds(profile: dict[str, Any], params: dict[str, Any], rules: list[str]) -> dict[str, tuple[int, int]]:
    """The least and most a job running these rules asks for, per resource: a group job needs at
    least its largest member's runtime and memory, and at most their sums (Snakemake adds runtimes
    in series and memory in parallel)."""
    each = [rule_resources(profile, params, rule) for rule in rules]
    return {key: (max(w[key] for w in each), sum(w[key] for w in each)) for key in ("runtime", "mem_mb")}


def sbatch_calls(log: str) -> list[str]:
    return re.findall(r"^sbatch call: (sbatch .*)$", log, flags=re.M)


def jobs_of(*jobids: str) -> dict[str, dict[str, str]]:
    """scontrol's record of each of these jobs, as key -> value."""
    records = {}
    for line in slurm("scontrol", "--details", "show", "job", "--oneliner").splitlines():
        fields = dict(re.findall(r"([\w/:]+)=(\S*)", line))
        if fields.get("JobId") in jobids:
            records[fields["JobId"]] = fields
    assert set(records) == set(jobids), f"scontrol does not know jobs {set(jobids) - set(records)}"
    return records


def minutes(limit: str) -> int:
    """'2-00:00:00' / '06:00:00' -> minutes."""
    days, _, hms = limit.rpartition("-")
    hours, mins, _ = (int(x) for x in hms.split(":"))
    return int(days or 0) * 1440 + hours * 60 + mins


def megabytes(size: str) -> float:
    return float(size[:-1]) * {"M": 1, "G": 1024, "T": 1024 ** 2}[size[-1]]


def scheduled_jobs(log: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Snakemake job id -> (rule, resources as snakemake resolved them), from the job
    blocks snakemake prints ('rule train:' ... 'jobid: 3' ... 'resources: a=1, b=2')."""
    jobs, rule, jobid = {}, None, None
    for line in log.splitlines():
        if match := re.match(r"\s*(?:local)?rule (\w+):$", line):  # indented: a member of a group job
            rule, jobid = match.group(1), None
        elif rule and (match := re.match(r"\s+jobid: (\d+)$", line)):
            jobid = match.group(1)
        elif rule and jobid and line.strip().startswith("resources: "):
            pairs = (item.split("=", 1) for item in line.strip().removeprefix("resources: ").split(", "))
            jobs[jobid] = (rule, dict(pairs))
            rule = jobid = None
    return jobs


def gpus_wanted(rule: str, params: dict[str, Any]) -> int:
    """The GPUs a job of this rule should ask for: none but for these rules."""
    cnn = any(spec["backbone"] not in CPU_BACKBONES for spec in params["datasets"].values() if spec["enabled"])
    own = {rule: spec.get("gpus", 0) for rule, spec in params["resources"].items()}
    return {**own, "train": params["train"]["gpus"], "features": int(cnn)}.get(rule, 0)


def planned_jobs(log: str) -> Counter:
    """Rule -> number of jobs, from snakemake's first 'Job stats' table."""
    table = log.split("Job stats:", 1)[1]
    counts = Counter()
    for line in table.splitlines()[3:]:
        name, *count = line.split()
        if name == "total":
            return counts
        counts[name] = int(count[0])
    raise AssertionError("no 'total' row in the Job stats table")


# -- the tests ---------------------------------------------------------------------------

@pytest.mark.parametrize("backbone, train_gpus", [("patches", 1), ("resnet101", 2)])
def test_the_profile_is_found_by_its_bare_name_from_the_repository_root(
        backbone: str, train_gpus: int, tiny_params: dict[str, Any], write_params: Callable[..., Path],
        tmp_path: Path) -> None:
    """`snakemake --profile slurm` as the README writes it (through the top-level `slurm`
    link): each rule's time, memory and signal; GPUs for train (train.gpus) and evaluate
    only, and for features only with a CNN backbone."""
    assert os.readlink(REPO / "slurm") == "workflow/profiles/slurm"
    work = copy_workflow(tmp_path)
    (work / "slurm").symlink_to("workflow/profiles/slurm")
    params = tiny_params
    params["datasets"]["synthetic"]["backbone"] = backbone
    params["train"]["gpus"] = train_gpus
    write_params(params)
    proc = subprocess.run(["snakemake", "--profile", "slurm", "-n", "all_tables"], cwd=work,
                          capture_output=True, text=True, timeout=300, env=cluster_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "Using profile slurm" in out

    profile = yte.process_yaml(PROFILE.read_text(), require_use_yte=True)
    jobs = [job for job in scheduled_jobs(out).values() if job[0] != "all_tables"]
    assert {rule for rule, _ in jobs} >= {"features", "train", "evaluate", "tables"}
    for rule, resources in jobs:
        wants = rule_resources(profile, params, rule)
        assert int(resources["runtime"]) == wants["runtime"], (rule, resources)
        assert int(resources["mem_mb"]) == wants["mem_mb"], (rule, resources)
        assert resources["slurm_extra"] == wants["slurm_extra"], (rule, resources)
        gpus, wanted = int(resources.get("gpu", 0)), gpus_wanted(rule, params)
        assert gpus == wanted, f"{rule} asks for {gpus} GPUs, not {wanted} (its `resources: gpu=`): {resources}"


def test_preempted_and_time_limited_jobs_resume(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """--requeue and --signal from the profile: a pre-empted job is requeued and resumes
    under the same job id; a job warned of its time limit saves, fails, and its retry
    (the profile's `retries`) resumes."""
    work = tmp_path / "resume"
    shutil.copytree(SLURM_DIR / "resume", work)
    profile = render_profile(tmp_path / "profile")
    proc = snakemake(work, tmp_path / "profile", ["--retries", str(profile["retries"]), "all"], RESUME_LIMIT_S)

    started: dict[str, str] = {}
    deadline = time.monotonic() + 150
    while len(started) < 2:
        assert proc.poll() is None, (work / "snakemake.log").read_text()[-5000:]
        assert time.monotonic() < deadline, "the two jobs did not start"
        for case in ("preempted", "time_limit"):
            events = work / "events" / f"{case}.log"
            if events.exists() and " started" in events.read_text():
                started[case] = events.read_text().split()[0]
        time.sleep(0.5)

    # What `--signal=TERM@300` sends before the time limit: SIGTERM to the job's steps.
    slurm("scancel", "--signal=TERM", started["time_limit"])
    # What SLURM does to a pre-empted job with PreemptMode=REQUEUE. A requeued job is held
    # for 120 s once it is pending again: StartTime=now releases it.
    job = started["preempted"]
    slurm("scontrol", "requeue", job)
    deadline = time.monotonic() + 60

    def state() -> str:
        assert time.monotonic() < deadline, slurm("squeue", "-h", "-j", job, "-o", "%T %r")
        time.sleep(0.3)
        return slurm("squeue", "-h", "-j", job, "-o", "%T").strip()

    while state() != "PENDING":  # the old run ends first
        pass
    while state() == "PENDING":
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
    log = finish(proc, work)

    preempted = (work / "events" / "preempted.log").read_text().splitlines()
    assert preempted == [f"{job} started", f"{job} signal {signal.SIGTERM.value}: state saved", f"{job} resumed"]
    record = jobs_of(job)[job]
    assert (record["Requeue"], record["Restarts"], record["JobState"]) == ("1", "1", "COMPLETED")

    time_limited = (work / "events" / "time_limit.log").read_text().splitlines()
    first = started["time_limit"]
    assert time_limited[:2] == [f"{first} started", f"{first} signal {signal.SIGTERM.value}: state saved"]
    retry, event = time_limited[2].split(" ", 1)
    assert event == "resumed" and retry != first and len(time_limited) == 3
    assert jobs_of(first)[first]["JobState"] == "FAILED"

    calls = sbatch_calls(log)
    assert len(calls) == 3  # two jobs and one retry
    for call in calls:
        assert " --requeue" in call and f" {profile['default-resources']['slurm_extra']}" in call, call


RECIPE = REPO / "configs" / "recipes" / "actor_critic-coco.yaml"  # the smallest paper-scale recipe (4 runs)


def scaled_down(recipe: Path, runs: list[str] | None = None) -> dict[str, Any]:
    """An overlay that runs ``recipe`` in minutes: its dataset made by the built-in generator at the
    tests' TINY sizes, its models, listener and objectives at TINY's sizes and epochs, one epoch per
    run; its runs (or the first ones, ``runs``), methods, inits, tables and per-rule resources stay
    the recipe's."""
    spec = yaml.safe_load(recipe.read_text())
    (name, entry), = [(n, e) for n, e in spec["datasets"].items() if e.get("enabled")]
    kept = {"runs": runs} if runs else {}
    return {
        "datasets": {name: {**generated_dataset(name, **TINY["synthetic"]), "vocab": {"min_count": 2, "max_length": 16},
                            **kept}},
        "models": {m: TINY["models"][model["arch"]] for m, model in spec.get("models", {}).items()},
        "listener": TINY["listener"],
        "objectives": {m: {**TINY["objectives"][m], **({"warmup_epochs": 1} if m == "listener" else {})}
                       for m in spec.get("objectives", {})},
        "runs": {run: {"options": {"epochs": 1}} for run in entry["runs"]},
        "train": TINY["train"], "decode": TINY["decode"], "features": TINY["features"],
        "claims": {"papers": []},  # the recipe's paper's claims are test_the_claims_on_slurm_give_the_local_verdicts's
    }


# Reduced (CI): the recipe's first two runs (XE and the listener, side by side: the same rules, groups
# and resources, 3 fewer waits of the plugin's growing status interval); full: all 4 (`pytest --full`).
@pytest.mark.parametrize("runs", [pytest.param(["fc-xe", "listener"], id="xe-listener"),
                                  pytest.param(None, id="every-run", marks=pytest.mark.full)])
def test_a_recipe_scaled_down_runs_every_job_on_slurm(slurm_cluster: Cluster, tiny_params: dict[str, Any],
                                                      write_params: Callable[..., Path], tmp_path: Path,
                                                      runs: list[str] | None) -> None:
    """`snakemake --profile slurm all_tables --configfile <recipe>` as docs/cluster.md writes it,
    with an overlay that shrinks the recipe's data and epochs: every job a SLURM job (short jobs in
    series grouped), each asking for the recipe's resources."""
    work = copy_workflow(tmp_path)
    write_params(tiny_params)
    overlay = tmp_path / "scaled_down.yaml"
    overlay.write_text(yaml.safe_dump(scaled_down(RECIPE, runs), sort_keys=False))
    params = params_mod.load([tmp_path / "params.yaml", RECIPE, overlay])
    planned_tables = build_plan(params).table_files()
    assert planned_tables and all(Path(t).name.startswith("coco_ac_table1.") for t in planned_tables)
    profile = render_profile(tmp_path / "profile-ci")
    started = time.monotonic()
    log = finish(snakemake(work, tmp_path / "profile-ci", ["all_tables", "--configfile", str(RECIPE), str(overlay)],
                           PIPELINE_LIMIT_S), work)
    print(f"all_tables of {RECIPE.name}, scaled down, on SLURM: {time.monotonic() - started:.0f} s")
    for table in planned_tables:
        assert (work / table).stat().st_size > 0, table

    # Every planned job but the target rule ran as a SLURM job, once.
    planned = planned_jobs(log)
    local = set(re.findall(r"^localrule (\w+):", log, flags=re.M))
    assert local == {"all_tables"}, local
    submitted = submissions(log)
    ran = {slurm_id: members(work, folder, slurm_id) for slurm_id, (_, folder) in submitted.items()}
    assert Counter(rule for rules in ran.values() for rule in rules) == planned - Counter(all_tables=planned["all_tables"])
    # the profile's groups (a group job's log folder: group_<group>_<its rules>)
    grouped = {folder.split("_")[1] for _, folder in submitted.values() if folder.startswith("group_")}
    assert grouped == {"data", "evaluation"}, grouped
    assert all(ran[slurm_id] == ["prepare", "vocab"] for slurm_id, (_, folder) in submitted.items()
               if folder.startswith("group_data_")), ran
    for slurm_id, (_, folder) in submitted.items():
        slurm_log = next(work.glob(f".snakemake/slurm_logs/{folder}/**/{slurm_id}.log"))
        assert all(f"rule {rule}:" in slurm_log.read_text() for rule in ran[slurm_id]), slurm_log

    # ... and SLURM knows exactly these jobs, all completed, under this run's job name.
    names = {line.split("|")[1] for line in slurm("squeue", "--states=all", "-h", "-o", "%i|%j").splitlines()
             if line.split("|")[0] in submitted}
    assert len(names) == 1, names
    squeue = slurm("squeue", "--states=all", "-h", f"--name={names.pop()}", "-o", "%i|%T|%k|%P|%l|%M").splitlines()
    print("squeue --states=all (id|state|comment|partition|time limit|time used):\n" + "\n".join(squeue))
    assert {line.split("|")[0] for line in squeue} == set(submitted)
    assert all(line.split("|")[1] == "COMPLETED" for line in squeue), squeue

    # Each job asked for what the profile (and its rule) give it, and SLURM granted it.
    records = jobs_of(*submitted)
    print("scontrol show job:\n" + "\n".join(
        " ".join(f"{key}={job.get(key)}" for key in ("JobId", "JobState", "ExitCode", "Requeue", "Partition",
                                                    "TimeLimit", "MinMemoryNode", "NumCPUs", "TresPerJob",
                                                    "JOB_GRES", "Comment"))
        for job in records.values()))
    scheduled = scheduled_jobs(log)
    controller_log = slurm_cluster.log()
    for slurm_id, (jobid, folder) in submitted.items():
        rules = ran[slurm_id]
        job, wants = records[slurm_id], rule_resources(profile, params, rules[0])
        resources = scheduled[jobid][1] if jobid in scheduled else {"gpu_model": wants.get("gpu_model")}
        summary = f"{rules} (SLURM job {slurm_id}): {resources}\n{job}"
        gpus = max(gpus_wanted(rule, params) for rule in rules)
        if jobid in scheduled:
            assert int(resources.get("gpu", 0)) == gpus, summary
        bounds = group_bounds(profile, params, rules)
        assert bounds["runtime"][0] <= minutes(job["TimeLimit"]) <= bounds["runtime"][1], (bounds, summary)
        assert bounds["mem_mb"][0] <= megabytes(job["MinMemoryNode"]) * 1.001, (bounds, summary)
        assert megabytes(job["MinMemoryNode"]) <= bounds["mem_mb"][1] * 1.001, (bounds, summary)
        assert (job["JobState"], job["ExitCode"], job["Requeue"]) == ("COMPLETED", "0:0", "1"), summary
        assert job["Partition"] == CLUSTER["partition"], summary
        if gpus:  # asked for (TresPerJob), then allocated on the node (JOB_GRES)
            model = resources.get("gpu_model")
            assert job["TresPerJob"] == (f"gres:gpu:{model}:{gpus}" if model else f"gres:gpu:{gpus}"), summary
            assert job["JOB_GRES"] == f"gpu:{CLUSTER['gpu_model']}:{gpus}", summary
            assert int(job["NumCPUs"]) == gpus * wants["cpus_per_gpu"], summary
        else:
            assert "TresPerJob" not in job and job["JOB_GRES"] == "(null)", summary
            cpus = int(job["NumCPUs"])  # a group's jobs side by side ask for the sum of their cores
            assert cpus == max(wants["cpus_per_task"], 1) if len(rules) == 1 else 1 <= cpus <= len(rules), summary
        assert any(line.format(id=slurm_id) in controller_log for line in JOB_STARTED), summary
        assert f"_job_complete: JobId={slurm_id} WEXITSTATUS 0" in controller_log, summary

    calls = sbatch_calls(log)
    assert len(calls) == len(submitted)
    for call in calls:
        assert " --requeue" in call and f" {profile['default-resources']['slurm_extra']}" in call, call


# Reduced (CI): one seed (13 SLURM jobs, each parsing the workflow and its claims modules: ~3 min);
# full: two seeds, a verdict with an interval (`pytest --full`; 327 s on this 2-core machine).
@pytest.mark.parametrize("seeds", [pytest.param([1], id="one-seed"),
                                   pytest.param([1, 2], id="two-seeds", marks=pytest.mark.full)])
def test_the_claims_on_slurm_give_the_local_verdicts(slurm_cluster: Cluster, tmp_path: Path, seeds: list[int]) -> None:
    """`snakemake --profile slurm all_claims` (issue 56): every job of every claims seed a SLURM job,
    the target rules local; the same seeds built locally (`--cores 2`) give the same scores in every
    seed and the same verdicts (one thread per job on both: the same kernels, the same sums)."""
    from test_claims_dag import workspace
    from test_e2e import run

    local = workspace(tmp_path / "local", {"900": seeds}, min_seeds=len(seeds))
    run(["snakemake", "--cores", "2", "all_claims"], local)
    work = workspace(tmp_path / "cluster", {"900": seeds}, min_seeds=len(seeds))
    render_profile(tmp_path / "profile-ci")
    started = time.monotonic()
    log = finish(snakemake(work, tmp_path / "profile-ci", ["all_claims"], PIPELINE_LIMIT_S), work)
    print(f"all_claims (one paper, {len(seeds)} seed(s), tiny) on SLURM: {time.monotonic() - started:.0f} s")
    planned = planned_jobs(log)
    local_rules = set(re.findall(r"^localrule (\w+):", log, flags=re.M))
    assert local_rules == {"all_claims"}, local_rules
    ran = Counter(rule for slurm_id, (_, folder) in submissions(log).items() for rule in members(work, folder, slurm_id))
    assert ran == planned - Counter(all_claims=1)
    assert ran["claims_900_verdicts"] == 1 and all(ran[f"claims_900_seed{s}_train"] == 2 for s in seeds)
    on_slurm, here = (json.loads((w / "results" / "claims" / "900.json").read_text()) for w in (work, local))
    for seed in map(str, seeds):
        assert on_slurm["per_seed"][seed]["runs"].keys() == here["per_seed"][seed]["runs"].keys()
        for run_name, scores in on_slurm["per_seed"][seed]["runs"].items():
            assert scores["metrics"] == here["per_seed"][seed]["runs"][run_name]["metrics"], (seed, run_name)
    assert [(r["a"], r["b"], r["verdict"], r["holm"]) for r in on_slurm["results"]] == \
        [(r["a"], r["b"], r["verdict"], r["holm"]) for r in here["results"]]


def test_stopping_the_cluster_leaves_no_daemon(slurm_cluster: Cluster) -> None:
    proc = slurm_cluster.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout)
    left = {pid: name for pid, name in daemon_pids().items() if pid not in slurm_cluster.preexisting}
    assert not left, f"still running after stop_cluster.sh: {left}"
    assert not any(os.path.realpath(f"/etc/slurm/{conf}").startswith(str(slurm_cluster.state))
                   for conf in ("slurm.conf", "gres.conf"))
