"""The job server (caprl.cli.job_server): `caprl` commands run as children of one pre-loaded process.

Real server processes, real `caprl` commands (the console script's `entry`, in fresh
interpreters), a real training job on a tiny generated dataset: the same outputs as a job run
by itself, its streams, directory, exit code; a SIGTERM to the command reaches the job (which
saves its step and exits 143) and the job resumes; a command without a server runs by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from caprl import cli
from caprl.cli import job_server
from caprl.runtime import socket_service
from conftest import TINY, default_params, merge
from pipeline_data import DatasetPaths, build_dataset, caprl_command


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Path]]:
    path = f"/tmp/caprl-js-{os.getpid()}.sock"
    log = Path(f"/tmp/caprl-js-{os.getpid()}.log")
    proc = job_server.start(path, parent_pid=os.getpid(), log_path=log)
    deadline = time.monotonic() + 120
    while not socket_service.live_server_at(path):  # it preloads before its socket appears
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    yield path, log
    assert socket_service.stop(path, job_server.SERVER_MODULE, what=job_server.WHAT)
    socket_service.stop_process(proc)
    assert proc.returncode == 0 and not os.path.lexists(path)
    log.unlink()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> DatasetPaths:
    params = merge(default_params(), TINY)
    params["runs"] = {"fc-xe": {"method": "xe", "model": "fc", "options": {"epochs": 6}}}
    params["datasets"]["synthetic"]["runs"] = ["fc-xe"]
    params["train"].update(batch_size=8, checkpoint_every=50)
    return build_dataset(tmp_path_factory.mktemp("jobs"), params)


def command(data: DatasetPaths, out: str) -> list[str]:
    return caprl_command("train", data.params, "--log", f"{out}/train.log", "--dataset", "synthetic", "--run", "fc-xe",
                         *data.train_args(), "--checkpoint", f"{out}/best.pt", "--history", f"{out}/history.json",
                         "--state-dir", f"{out}/state")


def env_for(server: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != job_server.SOCKET_ENV}
    env["MLFLOW_TRACKING_URI"] = "sqlite:///mlflow.db"
    return {**env, job_server.SOCKET_ENV: server} if server else env


def forked_jobs(log: Path) -> int:
    return log.read_text().count("forked job")


def weights(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)["modules"]["model"]["state"]


def test_a_job_in_the_server_gives_what_it_gives_alone_and_resumes_after_sigterm(
        server: tuple[str, Path], data: DatasetPaths) -> None:
    path, log = server
    alone = subprocess.run(command(data, "alone"), cwd=data.workdir, env=env_for(None), capture_output=True,
                           text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    before = forked_jobs(log)
    proc = subprocess.Popen(command(data, "served"), cwd=data.workdir, env=env_for(path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    train_log = data.workdir / "served/train.log"
    deadline = time.monotonic() + 120
    while "epoch 2:" not in (train_log.read_text() if train_log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what Snakemake or SLURM sends the command: the job must get it
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "received signal 15" in train_log.read_text() and "epoch 2:" in stderr  # the job's stderr is ours
    assert not (data.workdir / "served/best.pt").exists()
    resumed = subprocess.run(command(data, "served"), cwd=data.workdir, env=env_for(path), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert forked_jobs(log) == before + 2  # both ran in the server
    assert "resum" in resumed.stderr.lower()
    a, b = weights(data.workdir / "alone/best.pt"), weights(data.workdir / "served/best.pt")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)  # bit-identical


def test_exit_codes_errors_and_directory_are_the_commands(server: tuple[str, Path], tmp_path: Path) -> None:
    path, log = server
    before = forked_jobs(log)
    bad = subprocess.run([sys.executable, "-m", "caprl", "tune-report", "--params", "nowhere.yaml", "--dataset", "x",
                          "--out-md", "a.md", "--out-json", "a.json"],
                         cwd=tmp_path, env=env_for(path), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "nowhere.yaml" in bad.stderr  # a clear error, on the command's stderr
    helped = subprocess.run([sys.executable, "-m", "caprl", "curves", "--help"], cwd=tmp_path, env=env_for(path),
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: caprl curves")
    assert forked_jobs(log) == before + 2


def test_main_called_from_python_runs_in_its_caller(server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Only the command forwards: ``caprl.cli.main(argv)`` runs the stage here, server or not."""
    path, log = server
    before = forked_jobs(log)
    monkeypatch.setenv(job_server.SOCKET_ENV, path)
    with pytest.raises(SystemExit) as exc:
        cli.main(["curves", "--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: caprl curves")
    assert forked_jobs(log) == before


@pytest.mark.parametrize("where", ["gone", "off"])
def test_without_a_server_a_command_runs_by_itself(where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path = f"/tmp/caprl-js-{os.getpid()}-none.sock" if where == "gone" else "off"
    alone = subprocess.run([sys.executable, "-m", "caprl", "curves", "--help"], cwd=tmp_path, env=env_for(socket_path),
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and alone.stdout.startswith("usage: caprl curves")
    if where == "off":  # the Snakefile's hook starts none
        monkeypatch.setenv(job_server.SOCKET_ENV, "off")
        assert job_server.start_shared() is None and os.environ[job_server.SOCKET_ENV] == "off"


def test_a_forked_job_opens_the_mlflow_store_without_importing_it(tmp_path: Path) -> None:
    """What the server preloads covers what a tracked job imports when it opens and writes the
    SQLite store (SQLAlchemy, alembic: ~1 s of CPU each job paid before they were preloaded): a
    fresh interpreter preloads as the server does, then opens a new store, makes a run and logs a
    metric; no module of MLflow's store, SQLAlchemy or alembic is imported after the preload."""
    code = (
        "import sys\n"
        "from caprl.cli import job_server\n"
        "job_server.preload()\n"
        "before = set(sys.modules)\n"
        "from caprl.tracking.store import Store\n"
        f"store = Store('sqlite:///{tmp_path}/mlflow.db')\n"
        "_, run = store.open_run('e', 'r', {}, None, False)\n"
        "store.log_batch(run, metrics=[('m', 1.0, 0, 0)])\n"
        "late = sorted(m for m in set(sys.modules) - before\n"
        "              if m.startswith(('sqlalchemy', 'alembic', 'mlflow.store.tracking.sqlalchemy_store')))\n"
        "print('LATE', late)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LATE []" in out.stdout, out.stdout
