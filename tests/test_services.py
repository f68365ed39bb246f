"""`caprl with-services <command>`: the local run's two helpers for a command without hooks (dvc repro)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

VARIABLES = ("CAPRL_JOB_SERVER", "CAPRL_METEOR_SOCKET")

PROBE = """
import json, os, sys
from caprl.runtime import socket_service, wire
found = {}
for name in %r:
    path = os.environ.get(name)
    alive = False
    if path:
        try:
            wire.ping(path, name)
            alive = True
        except Exception:
            alive = False
    found[name] = [path, alive]
json.dump(found, open(sys.argv[1], "w"))
sys.exit(int(sys.argv[2]))
""" % (VARIABLES,)


def test_the_command_runs_with_the_two_services_and_its_exit_code_is_returned(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    probe, seen = tmp_path / "probe.py", tmp_path / "seen.json"
    probe.write_text(PROBE)
    proc = subprocess.run(["caprl", "with-services", "--", sys.executable, str(probe), str(seen), "3"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stderr[-3000:]  # the command's own exit code
    found = json.loads(seen.read_text())
    assert all(path and path.startswith("/tmp/caprl-") for path, _ in found.values()), found
    # the METEOR server answers at once; the job server's socket appears after its preloading
    assert found["CAPRL_METEOR_SOCKET"][1], found
    assert not any(os.path.exists(path) for path, _ in found.values())  # stopped, sockets removed
    logs = sorted(p.name for p in (tmp_path / "logs" / "services").iterdir())
    assert logs == sorted(["caprl.cli.job_server.log", "caprl.metrics.meteor_server.log"]), logs


def test_no_command_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(["caprl", "with-services"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no command given" in proc.stderr, proc.stderr


@pytest.mark.parametrize("env_var", ["CAPRL_JOB_SERVER", "CAPRL_METEOR_SOCKET"])
def test_a_server_variable_set_to_off_starts_no_server_and_jobs_work_alone(env_var: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``CAPRL_<SERVER>=off snakemake ...``: that shared server is not started (how docs/pipeline.md
    measures what each one saves), and the jobs' clients do the work themselves."""
    from caprl.runtime import job_client, socket_service

    launched: list[str] = []
    monkeypatch.setenv(env_var, socket_service.OFF)
    assert socket_service.start_shared(env_var, "test server", launched.append, "/tmp/caprl-test-off.sock",
                                       "caprl.test") is None
    socket_service.stop_shared(env_var)
    assert launched == [] and os.environ[env_var] == "off"
    if env_var == "CAPRL_JOB_SERVER":
        assert job_client.SOCKET_ENV == env_var and job_client.OFF == socket_service.OFF
