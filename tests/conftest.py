"""Shared fixtures: the repository root, tiny params files, the shared reference data."""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
SCHEMA = REPO / "workflow" / "schemas" / "params.schema.yaml"

os.environ.setdefault("CAPRL_PARAMS_SCHEMA", str(SCHEMA))
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

TINY: dict[str, Any] = {
    # the video set is off here (tests replace runs:); test_e2e turns it on (TINY_VIDEO)
    "datasets": {"synthetic_video": {"enabled": False}},
    "synthetic": {"n_train": 80, "n_val": 16, "n_test": 16, "image_size": 32, "max_objects": 2},
    "vocab": {"min_count": 2},
    "models": {name: {"embed_size": 16, "hidden_size": 24, **({"att_hidden_size": 16} if att else {})}
               for name, att in [("fc", False), ("fc_lstm", False), ("fc_lstm_state", False), ("topdown", True),
                                 ("lstm3", False), ("softatt", True), ("stackcap_star", True), ("stackcap", True)]}
              | {"transformer": {"num_layers": 1, "d_model": 16, "heads": 2, "d_ff": 32}},
    "objectives": {"xe": {"epochs": 2}, "scst": {"epochs": 1, "n_samples": 2}, "c2f": {"epochs": 1, "n_samples": 2},
                   "pg_spider": {"epochs": 1, "rollouts": 2, "baseline_hidden": 8, "baseline_warmup_steps": 1},
                   "mixer": {"epochs": 1},
                   "sll": {"epochs": 1, "n_samples": 2}, "sll_sle": {"epochs": 1, "n_samples": 2},
                   **{m: {"epochs": 1} for m in ("listener", "luo2018", "reinforce_joint", "st_gumbel", "st_multinomial",
                                                 "psst_gumbel", "psst_multinomial", "frozen_speaker", "value",
                                                 "actor_critic")}},
    "listener": {"word_size": 8, "hidden_size": 16},
    "sweeps": {"lam": [0.5], "rho": [0.25]},  # one point per paper-004 method (fc-frozen_speaker_luo's init)
    "train": {"batch_size": 20, "checkpoint_every": 3, "log_every": 2},
    "runs": {},  # below: every params.yaml run that sets its own epochs gets its method's TINY epochs
    "decode": {"beam_size": 2},
    "evaluate": {"metrics": ["bleu", "rouge_l", "cider_d", "spice"], "n_examples": 3,
                 "diversity": {"samples": 2, "beams": 2, "examples": 2}},
    "features": {"batch_size": 16, "video": {"frames": 4}},
}

# params.yaml's runs that set their own (demo-sized) epochs train their method's TINY epochs instead
TINY["runs"] = {run: {"options": {"epochs": TINY["objectives"][spec["method"]]["epochs"]}}
                for run, spec in yaml.safe_load((REPO / "params.yaml").read_text())["runs"].items()
                if "epochs" in (spec.get("options") or {})}


TINY_VIDEO: dict[str, Any] = {  # the built-in video set, tiny, with an attention model (it attends over frames)
    "enabled": True,
    "synthetic": {"n_train": 40, "n_val": 8, "n_test": 8, "image_size": 32, "max_objects": 2, "frames": 4},
    "runs": ["fc_lstm_state-xe", "fc_lstm_state-sll", "fc_lstm_state-sll_me", "fc_lstm_state-sll_sle", "topdown-xe",
             "topdown-sll_sle"],
}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` laid over a copy of ``base`` as a recipe is over params.yaml (caprl.params.merge)."""
    from caprl.params import merge as lay

    return lay(copy.deepcopy(base), override)


def default_params() -> dict[str, Any]:
    """params.yaml, its objectives over their shared defaults, without its tuning grids (they name
    params.yaml's runs; tests replace runs: and name their own tuning)."""
    from caprl.params import with_objective_defaults

    params = with_objective_defaults(yaml.safe_load((REPO / "params.yaml").read_text()))
    params["tuning"]["runs"] = {}
    return params


def generated_dataset(name: str, **overrides: Any) -> dict[str, Any]:
    """A ``datasets:`` entry made by the built-in generator (``overrides``: its ``synthetic:``)."""
    entry = {"format": "karpathy", "raw": f"data/raw/{name}/dataset_{name}.json",
             "media_root": f"data/raw/{name}/images", "generate": True, "backbone": "patches", "enabled": True}
    return {**entry, **({"synthetic": overrides} if overrides else {})}


def two_dataset_params() -> dict[str, Any]:
    """TINY with a second generated dataset, ``shapes_b`` (one object per image, fewer images)."""
    params = merge(default_params(), TINY)
    params["datasets"]["shapes_b"] = generated_dataset("shapes_b", n_train=60, max_objects=1)
    return params


# The test files whose tests take longest (or wait longest: SLURM's status checks, DVC), run first, so
# that under pytest-xdist (`-n auto --dist loadfile`, pyproject.toml) they overlap the many short ones.
SLOW_FIRST = ("test_slurm_cluster.py", "test_e2e.py", "test_tracking.py", "test_ddp.py", "test_resume.py",
              "test_datasets_dag.py", "test_bad_input_research.py", "test_rewards_benchmark.py")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per core this process may run on (many tests wait on subprocesses,
    SLURM's status checks, JVMs; xdist's own count asks psutil for the host's physical cores: 22 on
    this 2-core machine); $PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or 2 * len(os.sched_getaffinity(0)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="also run the full forms of the slow tests (marked `full`: every kill point, both DDP "
                          "models, the whole SLURM recipe, screenshots); CI runs their reduced forms")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: same order on every worker
    if not config.getoption("--full"):
        skip = pytest.mark.skip(reason="the full form of a slow test: `pytest --full` (CI runs the reduced form)")
        for item in items:
            if "full" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def job_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """Every ``caprl`` job a test starts runs as a local Snakemake run's jobs do: forked from a job
    server that imported torch, MLflow and the stages once (:mod:`caprl.cli.job_server`; ~8 CPU s
    saved a job), one server per test worker, which the tests' Snakemake runs use too (their
    ``onstart`` takes a live exported server as it is). A test of a job's own process (killed
    mid-write, pre-empted, resumed: its signals and pid) uses :func:`jobs_by_themselves`.
    ``CAPRL_JOB_SERVER=off pytest``: no server, every job by itself."""
    from caprl.cli import job_server as server
    from caprl.runtime import socket_service

    if os.environ.get(server.SOCKET_ENV) == socket_service.OFF:
        yield None
        return
    path = f"/tmp/caprl-tests-{os.getuid()}-{os.getpid()}.sock"
    log = tmp_path_factory.getbasetemp() / f"job-server-{os.getpid()}.log"
    proc = server.start(path, log_path=log)  # preloads in the background; jobs before it run alone
    os.environ[server.SOCKET_ENV] = path
    try:
        yield path
    finally:
        if os.environ.get(server.SOCKET_ENV) == path:
            del os.environ[server.SOCKET_ENV]
        with contextlib.suppress(Exception):
            socket_service.stop(path, server.SERVER_MODULE, what=server.WHAT)
        socket_service.stop_process(proc)


@pytest.fixture
def jobs_by_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``caprl`` jobs this test starts run in their own processes (no job server): for a test
    that signals a job or reads its pid."""
    monkeypatch.setenv("CAPRL_JOB_SERVER", "off")


def full_run(config: pytest.Config) -> bool:
    """Whether this session runs the full forms (``--full``)."""
    return bool(config.getoption("--full"))


@pytest.fixture
def tiny_params() -> dict[str, Any]:
    """The repository's params.yaml shrunk to run every stage in seconds."""
    return merge(default_params(), TINY)


@pytest.fixture
def write_params(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(params: dict[str, Any], name: str = "params.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        return path

    return write


@contextlib.contextmanager
def sigterm_after_step(n: int) -> Iterator[None]:
    """Make the trainer send this process a real SIGTERM right after its ``n``-th step (its own
    handler saves the state and stops the run); restores the step and the signal handlers."""
    import signal

    from caprl.training.loop import Trainer

    real_step, calls = Trainer.step, 0

    def step_then_sigterm(self: Trainer, image_ids: list[int], loaded: Any) -> dict[str, float]:
        nonlocal calls
        metrics = real_step(self, image_ids, loaded)
        calls += 1
        if calls == n:
            assert callable(signal.getsignal(signal.SIGTERM)), "fit() installed no SIGTERM handler"
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    Trainer.step = step_then_sigterm  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer.step = real_step  # type: ignore[method-assign]
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def research_dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The TINY synthetic set through the real stages, with its test references (stage_inputs),
    shared by the bad-input and provenance tests."""
    from stage_inputs import research_dataset as build

    return build(tmp_path_factory.mktemp("tiny"))
