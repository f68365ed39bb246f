"""Training survives pre-emption: a job killed at any point and restarted with the same
arguments ends bit-identical to an uninterrupted one.

Every job here is a real ``python -m caprl train`` subprocess on a tiny dataset made by the
real stages (tests/pipeline_data.py), tracked in a real MLflow sqlite store. The kill points
are read from the job's own state file: the test polls ``state/last.pt`` and signals the job
as soon as it holds the chosen position, so a kill point is "right after the trainer saved
epoch E, batch B", not a guess in seconds. Three batches per epoch, a checkpoint every 2
steps: XE saves at steps 2, 3 (epoch end), 4, 6 (last batch), 6 (epoch end), 8, 9. The RL runs
start from XE weights (an init): they first validate them (epoch 0) and save at step 0.
The XE run decays its rate (x0.5 every epoch): a resumed run must set the same rates.
Not marked ``numerics``: the resumed and the uninterrupted run replay the same operations on the
same shapes in one process's kernels, so they are bit-identical whatever kernels the CPU picks.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
import torch
import yaml

from conftest import TINY, default_params, merge, sigterm_after_step
from pipeline_data import DatasetPaths, build_dataset, caprl_command

RESUME = {
    "synthetic": {"n_train": 60},
    "models": {"fc": {"embed_size": 16, "hidden_size": 24, "dropout": 0.1}},  # dropout: XE draws from the RNG too
    "train": {"batch_size": 20, "checkpoint_every": 2, "log_every": 1, "num_threads": 1},
}
LR_DECAY = {"lr_decay_every": 1, "lr_decay_rate": 0.5}
RUNS = {  # replaces params.yaml's runs: just the ones this file trains, XE first
    "fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 3, **LR_DECAY}},
    "fc-scst": {"method": "scst", "model": "fc", "init": {"model": "fc-xe"}, "options": {"epochs": 2, "n_samples": 2}},
    "fc-pg_spider": {"method": "pg_spider", "model": "fc", "init": {"model": "fc-xe"},
                     "options": {"epochs": 2, "rollouts": 2, "baseline_warmup_steps": 2}},  # a module of its own;
    # its warm-up ends inside epoch 1, so the kill points resume across it
}
N_BATCHES = RESUME["synthetic"]["n_train"] // RESUME["train"]["batch_size"]  # 3
EPOCHS = {run: spec["options"]["epochs"] for run, spec in RUNS.items()}
INIT = {run: spec["init"]["model"] for run, spec in RUNS.items() if "init" in spec}
DATASET = "synthetic"
JOB_TIMEOUT = 180  # seconds, for one train job (~10 s on an idle 2-core machine, mostly imports)
# Fields that legitimately differ between two runs: wall-clock time, the MLflow run of the job.
IGNORED = {"seconds", "mlflow_run_id"}
SEED = 20261121  # the seeded kill point


class Pos(NamedTuple):
    epoch: int
    batch: int
    step: int


@dataclass(frozen=True)
class RunDirs:
    """Where one job writes: its --checkpoint, --history, --state-dir and --log."""

    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / "best.pt"

    @property
    def history(self) -> Path:
        return self.root / "history.json"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def last(self) -> Path:
        return self.state / "last.pt"


@dataclass(frozen=True)
class Setup:
    data: DatasetPaths
    env: dict[str, str]
    tracking_uri: str
    reference: dict[str, RunDirs]  # run name -> the uninterrupted run


# --- jobs ---------------------------------------------------------------------------------
def train_command(setup: Setup, run: str, dirs: RunDirs) -> list[str]:
    """The workflow's train command; an RL run starts from the reference XE run's checkpoint."""
    data = setup.data
    init = ["--init", f"model={setup.reference[INIT[run]].checkpoint}"] if run in INIT else []
    return caprl_command("train", data.params, "--log", dirs.log, "--dataset", DATASET, "--run", run,
                         *data.train_args(), *init,
                         "--checkpoint", dirs.checkpoint, "--history", dirs.history, "--state-dir", dirs.state)


def launch(cmd: list[str], dirs: RunDirs, cwd: Path, env: dict[str, str], attempt: int) -> subprocess.Popen[bytes]:
    dirs.root.mkdir(parents=True, exist_ok=True)
    with open(dirs.root / f"output{attempt}.txt", "wb") as out:  # killed and signalled by its pid: no job server
        return subprocess.Popen(cmd, cwd=cwd, env={**env, "CAPRL_JOB_SERVER": "off"}, stdout=out,
                                stderr=subprocess.STDOUT)


def output(dirs: RunDirs, attempt: int) -> str:
    return (dirs.root / f"output{attempt}.txt").read_text(errors="replace")[-6000:]


def finish(proc: subprocess.Popen[bytes], dirs: RunDirs, attempt: int, expect_rc: int = 0) -> None:
    try:
        rc = proc.wait(timeout=JOB_TIMEOUT)
    finally:
        stop(proc)
    assert rc == expect_rc, f"job exited with {rc}, expected {expect_rc}:\n{output(dirs, attempt)}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a job this test started if it still runs (a failed assertion must not leave it behind)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def run_job(setup: Setup, run: str, dirs: RunDirs, attempt: int = 1) -> None:
    proc = launch(train_command(setup, run, dirs), dirs, setup.data.workdir, setup.env, attempt)
    finish(proc, dirs, attempt)


def load(path: Path) -> dict[str, Any]:
    """A checkpoint as stored (weights_only), with its position's fields also at the top level."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    return {**payload, **payload["position"]}


def position(path: Path) -> Pos | None:
    try:
        state = load(path)
    except FileNotFoundError:
        return None
    return Pos(state["epoch"], state["batch"], state["step"])


def temp_files(state_dir: Path) -> list[Path]:
    """atomic_path's temporaries (``.NAME.XXXX.tmp``): present only while a file is being written."""
    return sorted(state_dir.glob(".*.tmp")) if state_dir.exists() else []


Trigger = Callable[[Pos | None, RunDirs], bool]


def wait_for(proc: subprocess.Popen[bytes], dirs: RunDirs, trigger: Trigger, attempt: int,
             timeout: float = JOB_TIMEOUT) -> Pos | None:
    """Poll the job's state file until ``trigger(position, dirs)``; the position it fired on."""
    deadline, seen, pos = time.monotonic() + timeout, None, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended (exit {proc.returncode}) before the kill point; last state "
                                 f"{pos}:\n{output(dirs, attempt)}")
        try:
            st = os.stat(dirs.last)
            key: tuple[int, ...] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = None
        if key != seen:
            try:
                seen, pos = key, position(dirs.last)
            except Exception as exc:  # a reader must never see a partial file
                raise AssertionError(f"{dirs.last} was not a complete checkpoint when read: {exc!r}") from exc
        if trigger(pos, dirs):
            return pos
        time.sleep(0.0005)
    raise AssertionError(f"kill point not reached in {timeout}s (last state {pos})")


def at(epoch: int, batch: int) -> Trigger:
    """Fires once ``last.pt`` holds this position (the save right after it), or a later one if polling missed it."""
    return lambda pos, _dirs: pos is not None and (pos.epoch, pos.batch) >= (epoch, batch)


def while_saving(pos: Pos | None, dirs: RunDirs) -> bool:
    """Fires while the trainer is writing a state file, after its first save (so there is one to lose)."""
    return pos is not None and bool(temp_files(dirs.state))


def seeded_trigger(run: str) -> tuple[Trigger, float]:
    """A seeded choice among the run's saves, and a seeded delay (s) before the kill."""
    rng = random.Random(f"{SEED}-{run}")
    saves = sorted({(e, b) for e in range(EPOCHS[run]) for b in range(1, N_BATCHES + 1)
                    if (e * N_BATCHES + b) % RESUME["train"]["checkpoint_every"] == 0}
                   | {(e, 0) for e in range(1, EPOCHS[run])})
    epoch, batch = rng.choice(saves[:-1])
    return at(epoch, batch), rng.uniform(0.0, 0.02)


def resumed_at(dirs: RunDirs) -> list[Pos]:
    """Every 'resumed from ...' line of the job's log."""
    found = re.findall(r"resumed from \S+ at epoch (\d+), batch (\d+) \(step (\d+)\)", dirs.log.read_text())
    return [Pos(*map(int, f)) for f in found]


def total_steps(run: str) -> int:
    return EPOCHS[run] * N_BATCHES


# --- comparisons ----------------------------------------------------------------------------
def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Every place where ``a`` (resumed) and ``b`` (reference) differ; tensors must be equal bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key in IGNORED:
                continue
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in the {'resumed' if key in a else 'reference'} run")
            else:
                out.extend(differences(a[key], b[key], f"{where}.{key}"))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{where}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"]
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
            return [f"{where}: tensors differ (max |diff| {gap})"]
        return []
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} != {b!r} (resumed != reference)"]


def assert_same_as_reference(dirs: RunDirs, reference: RunDirs) -> None:
    """The resumed job's outputs and state equal the uninterrupted job's, every tensor bit for bit."""
    diffs = []
    for name, mine, ref in [("--checkpoint", dirs.checkpoint, reference.checkpoint),
                            ("state/best.pt", dirs.state / "best.pt", reference.state / "best.pt"),
                            ("state/last.pt", dirs.last, reference.last)]:
        diffs += differences(load(mine), load(ref), name)
    diffs += differences(json.loads(dirs.history.read_text()), json.loads(reference.history.read_text()),
                         "history.json")
    assert not diffs, "the resumed run differs from the uninterrupted one:\n  " + "\n  ".join(diffs)


def assert_all_checkpoints_load(*dirs: Path) -> None:
    """Every .pt file left behind is a complete checkpoint (weights_only, as caprl loads them)."""
    from caprl.models import checkpoint

    files = [p for d in dirs if d.exists() for p in d.rglob("*.pt")]
    for path in files:
        checkpoint.load(path)  # raises CaprlError on a truncated or foreign file
    assert all(not p.name.endswith(".pt") for d in dirs for p in temp_files(d))


def metric_history(setup: Setup, run_id: str, key: str = "train/loss") -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=setup.tracking_uri)
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    """The tiny dataset (real stages) and the uninterrupted reference runs, XE then SCST from XE."""
    root = tmp_path_factory.mktemp("resume")
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    params = {**merge(merge(default_params(), TINY), RESUME), "runs": RUNS}
    data = build_dataset(root / "work", params, env=env)
    reference = {run: RunDirs(root / "reference" / run) for run in EPOCHS}
    done = Setup(data, env, tracking_uri, reference)
    for run in EPOCHS:  # fc-xe first: fc-scst starts from its checkpoint
        run_job(done, run, reference[run])
    return done


# --- tests -------------------------------------------------------------------------------------
def test_objective_modules_are_in_the_checkpoint(setup: Setup) -> None:
    """PG-SPIDEr's baseline MLP is saved with its config beside the caption model (best and last),
    trained (it moved away from its initial weights), and its optimiser state is in last.pt."""
    from caprl.models import checkpoint

    dirs = setup.reference["fc-pg_spider"]
    for path in (dirs.checkpoint, dirs.last):
        ckpt = checkpoint.load(path)
        assert set(ckpt.modules) == {"model", "baseline"}
        assert ckpt.modules["baseline"].arch == "pg_spider.baseline"
        assert ckpt.modules["baseline"].options["rollouts"] == 2
        assert ckpt.run["method"] == "pg_spider" and ckpt.run["init"] == {"model": "fc-xe"}
    last = checkpoint.load(dirs.last)
    assert last.optimizer is not None and len(last.optimizer["param_groups"]) == 2
    torch.manual_seed(0)
    first = checkpoint.load(setup.reference["fc-xe"].checkpoint)
    assert not torch.equal(last.modules["model"].state["logit.weight"], first.modules["model"].state["logit.weight"])


def test_reference_runs_are_what_the_kill_points_assume(setup: Setup) -> None:
    for run, dirs in setup.reference.items():
        last = load(dirs.last)
        assert Pos(last["epoch"], last["batch"], last["step"]) == Pos(EPOCHS[run], 0, total_steps(run))
        history = json.loads(dirs.history.read_text())
        start = [0] if run in INIT else []  # an init run's epoch 0: its starting weights, validated at step 0
        assert [h["step"] for h in history["epochs"]] == start + [N_BATCHES * (e + 1) for e in range(EPOCHS[run])]
        assert [h["epoch"] for h in history["epochs"]] == start + list(range(1, EPOCHS[run] + 1))
        assert history["best_epoch"] == last["best_epoch"] == load(dirs.checkpoint)["best_epoch"]
        assert resumed_at(dirs) == []
        steps = [s for s, _ in metric_history(setup, last["mlflow_run_id"])]
        assert steps == list(range(1, total_steps(run) + 1))
        val_steps = [s for s, _ in metric_history(setup, last["mlflow_run_id"], "val/CIDEr-D")]
        assert val_steps == start + [N_BATCHES * (e + 1) for e in range(EPOCHS[run])]
        assert metric_history(setup, last["mlflow_run_id"], "best/epoch") == [(total_steps(run), history["best_epoch"])]


def test_the_step_decay_sets_each_epochs_rate(setup: Setup) -> None:
    """fc-xe: x0.5 every epoch, in the history (``lr``), in MLflow (``train/lr``) and in the
    optimiser the state holds; the runs without decay keep their rate."""
    params = yaml.safe_load(setup.data.params.read_text())
    for run, dirs in setup.reference.items():
        lr = params["objectives"][RUNS[run]["method"]]["lr"]
        rate = 0.5 if run == "fc-xe" else 1.0
        expected = [lr * rate ** e for e in range(EPOCHS[run])]
        history = json.loads(dirs.history.read_text())["epochs"]
        assert [h["lr"] for h in history if not h.get("start")] == expected, run
        logged = metric_history(setup, load(dirs.last)["mlflow_run_id"], "train/lr")
        assert logged == [(N_BATCHES * (e + 1), pytest.approx(v)) for e, v in enumerate(expected)], run
        assert load(dirs.last)["optimizer"]["param_groups"][0]["lr"] == expected[-1]


KILL_POINTS = {
    "xe-mid-epoch": ("fc-xe", at(1, 1)),                # saved at step 4, killed in step 5
    "xe-after-epoch-end": ("fc-xe", at(1, 0)),          # the epoch-end save: resume at an epoch's start
    "xe-after-last-batch": ("fc-xe", at(1, N_BATCHES)),  # step 6 saved, killed during validation
    "xe-while-saving": ("fc-xe", while_saving),         # SIGKILL while last.pt's temporary is being written
    "scst-after-start": ("fc-scst", at(0, 0)),          # its start validated and saved (step 0), no step yet
    "scst-seeded": ("fc-scst", None),                   # RL; a seeded choice of save and of delay after it
    "pg_spider-seeded": ("fc-pg_spider", None),         # roll-outs and a baseline MLP of the objective's own
}


FULL_ONLY = {"xe-after-epoch-end", "xe-after-last-batch", "scst-after-start"}  # `pytest --full`


@pytest.mark.timeout(4 * JOB_TIMEOUT)
@pytest.mark.parametrize("kill_point", [pytest.param(k, marks=pytest.mark.full) if k in FULL_ONLY else k
                                        for k in KILL_POINTS])
def test_sigkill_then_restart_matches_the_uninterrupted_run(setup: Setup, tmp_path: Path, kill_point: str) -> None:
    run, trigger = KILL_POINTS[kill_point]
    delay = 0.0
    if trigger is None:
        trigger, delay = seeded_trigger(run)
    dirs = RunDirs(tmp_path / run)
    proc = launch(train_command(setup, run, dirs), dirs, setup.data.workdir, setup.env, 1)
    try:
        while True:
            wait_for(proc, dirs, trigger, 1)
            time.sleep(delay)
            proc.send_signal(signal.SIGSTOP)  # freeze it where it is, to see what it was doing
            writing = temp_files(dirs.state)
            if writing or kill_point != "xe-while-saving":
                break
            proc.send_signal(signal.SIGCONT)  # the save ended before the freeze: wait for the next one
        proc.send_signal(signal.SIGKILL)
        finish(proc, dirs, 1, expect_rc=-signal.SIGKILL)
    finally:
        stop(proc)
    if kill_point == "xe-while-saving":
        assert temp_files(dirs.state) == writing, "killed mid-write: its temporary must be all that is left of it"
    assert not dirs.checkpoint.exists() and not dirs.history.exists(), "the job finished before the kill"
    assert_all_checkpoints_load(dirs.state)
    on_disk = position(dirs.last)
    assert on_disk is not None and 0 <= on_disk.step < total_steps(run)
    if kill_point == "scst-after-start":
        assert on_disk == Pos(0, 0, 0), "the kill was meant to land between the start's save and step 2's"
    if on_disk.step == 0:  # only an init run saves before its first step: its validated start
        assert [h["epoch"] for h in load(dirs.last)["history"]] == [0] and run in INIT

    run_job(setup, run, dirs, attempt=2)
    assert resumed_at(dirs) == [on_disk], "the restarted job did not resume from the state on disk"
    assert_same_as_reference(dirs, setup.reference[run])
    assert_all_checkpoints_load(dirs.state, dirs.root)


@pytest.mark.timeout(4 * JOB_TIMEOUT)
@pytest.mark.parametrize(("signum", "run", "trigger"), [
    (signal.SIGTERM, "fc-xe", at(0, 2)),
    # full: the same handler under RL (CI's scst-seeded kill resumes an SCST run) and SIGUSR1
    pytest.param(signal.SIGTERM, "fc-scst", at(1, 1), marks=pytest.mark.full),
    pytest.param(signal.SIGUSR1, "fc-xe", at(1, 0), marks=pytest.mark.full),
], ids=["sigterm-xe", "sigterm-scst", "sigusr1-xe"])
def test_signal_saves_the_current_step_and_exits_then_resumes(setup: Setup, tmp_path: Path, signum: int, run: str,
                                                              trigger: Trigger) -> None:
    """SIGTERM/SIGUSR1 (SLURM's pre-emption signals): save the step the job is at, exit 128+signum."""
    dirs = RunDirs(tmp_path / run)
    proc = launch(train_command(setup, run, dirs), dirs, setup.data.workdir, setup.env, 1)
    try:
        seen = wait_for(proc, dirs, trigger, 1)
        proc.send_signal(signum)
        finish(proc, dirs, 1, expect_rc=128 + signum)
    finally:
        stop(proc)
    assert f"received signal {signum}" in dirs.log.read_text()
    assert not dirs.checkpoint.exists(), "the job finished instead of stopping"
    assert_all_checkpoints_load(dirs.state)
    state = load(dirs.last)
    saved = Pos(state["epoch"], state["batch"], state["step"])
    assert seen is not None and saved.step > seen.step, "the signal did not save a new state"
    assert saved.epoch * N_BATCHES + saved.batch == saved.step, f"inconsistent position {saved}"
    # The state holds the step the job was at: the last step it did (and logged) is the saved one.
    logged = [s for s, _ in metric_history(setup, state["mlflow_run_id"])]
    assert logged == list(range(1, saved.step + 1))

    run_job(setup, run, dirs, attempt=2)
    assert resumed_at(dirs) == [saved]
    assert_same_as_reference(dirs, setup.reference[run])
    # One MLflow run across the restart, every step logged once, with the uninterrupted run's losses.
    run_id = load(dirs.last)["mlflow_run_id"]
    assert run_id == state["mlflow_run_id"]
    reference_id = load(setup.reference[run].last)["mlflow_run_id"]
    assert metric_history(setup, run_id) == metric_history(setup, reference_id)


# A writer of real checkpoints for the test below: a fresh interpreter that forks one child per
# line read (the parent has no threads, so forking is safe); the child saves n+1, n+2, ... with
# caprl.models.checkpoint.save_payload until it is killed; the parent prints its pid, then reaps it.
WRITER = """
import os, sys
import torch
from caprl.models import checkpoint
for line in sys.stdin:
    n = int(line)
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                n += 1
                checkpoint.save_payload(sys.argv[1], {"step": n, "model_state": {
                    f"w{i}": torch.full((256, 256), float(n)) for i in range(8)}})
        finally:
            os._exit(1)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


@pytest.mark.timeout(120)
def test_sigkill_during_checkpoint_writes_never_leaves_a_broken_checkpoint(tmp_path: Path) -> None:
    """SIGKILL a writer of real checkpoints (``caprl.models.checkpoint.save_payload``) mid-write, many times.

    Each payload (2 MB) has every tensor filled with its save number, so a truncated or mixed
    file is seen. The writer is frozen (SIGSTOP) at a random moment after its first save and
    killed; as it does nothing but save, most kills land during a write (seen by the
    temporary that atomic_path writes beside the target).
    """
    from caprl.models import checkpoint

    # at least 12 kills, and on until 4 of them landed during a write (at most 60: a loaded machine
    # lets the writer finish its save before the freeze more often)
    path, kills, mid_write = tmp_path / "state" / "last.pt", 12, 0
    rng = random.Random(SEED)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    assert server.stdin is not None and server.stdout is not None
    try:
        previous = None
        attempt = -1
        while (attempt := attempt + 1) < kills or (mid_write < kills // 3 and attempt < 5 * kills):
            base = (attempt + 1) * 1_000_000
            server.stdin.write(f"{base}\n")
            server.stdin.flush()
            pid = int(server.stdout.readline())
            try:
                deadline = time.monotonic() + 60
                while not path.exists() or _identity(path) == previous:  # this writer's first save
                    assert time.monotonic() < deadline, "the writer never saved"
                    time.sleep(0.0002)
                time.sleep(rng.uniform(0.0, 0.01))
                os.kill(pid, signal.SIGSTOP)  # freeze, then see whether it is mid-write
                mid_write += bool(temp_files(path.parent))
            finally:
                os.kill(pid, signal.SIGKILL)
                assert server.stdout.readline().strip() == "reaped"
            previous = _identity(path)
            payload = checkpoint.load_payload(path)  # CaprlError if the kill left it truncated
            assert payload["step"] > base
            assert all(bool((t == payload["step"]).all()) for t in payload["model_state"].values()), \
                f"{path} mixes saves: {sorted({float(t.flatten()[0]) for t in payload['model_state'].values()})}"
            assert [p.name for p in path.parent.iterdir() if p.suffix == ".pt"] == ["last.pt"]
            for leftover in temp_files(path.parent):  # a killed writer cannot remove its temporary
                leftover.unlink()
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        finally:
            stop(server)  # type: ignore[arg-type]
    assert mid_write >= kills // 3, f"only {mid_write} of {attempt} kills landed during a write"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop_after", [2, N_BATCHES], ids=["mid-epoch", "after-last-batch"])
def test_resumed_epoch_train_loss_counts_every_batch_of_the_epoch(setup: Setup, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    stop_after: int) -> None:
    """In-process and fast: a real SIGTERM to this process after step k of ``caprl.training.run.train``,
    then a second call resumes; its per-epoch history (train loss too) is the uninterrupted run's.

    ``after-last-batch`` stops after the last batch of epoch 1, before its validation: the saved
    state has ``batch == n_batches`` and the resumed job runs no batch of that epoch.
    """
    from caprl import params as params_mod
    from caprl.training import run as run_mod
    from caprl.data.loader import CaptionData, DataPaths
    from caprl.training.loop import Preempted

    d = setup.data
    monkeypatch.setenv("MLFLOW_TRACKING_URI", setup.tracking_uri)
    monkeypatch.chdir(d.workdir)  # where the Tracker keeps its lock file
    params = params_mod.load(d.params)
    data = CaptionData(DataPaths(str(d.annotations), str(d.vocab), str(d.labels), str(d.features)))
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        with sigterm_after_step(stop_after), pytest.raises(Preempted) as stopped:
            run_mod.train(params, DATASET, "fc-xe", data, str(d.cider_df), {}, tmp_path / "state")
        assert stopped.value.code == 128 + signal.SIGTERM
        assert position(tmp_path / "state" / "last.pt") == Pos(0, stop_after, stop_after)
        _, ended = run_mod.train(params, DATASET, "fc-xe", data, str(d.cider_df), {}, tmp_path / "state")
        history = ended.history
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    reference = json.loads(setup.reference["fc-xe"].history.read_text())["epochs"]
    diffs = differences(history, reference, "history")
    assert not diffs, "the resumed run's history differs from the uninterrupted one:\n  " + "\n  ".join(diffs)
