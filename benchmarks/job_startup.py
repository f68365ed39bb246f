"""What a pipeline job pays before it works: by itself vs through a local run's job server and MLflow relay.

    python benchmarks/job_startup.py [--jobs N] [--json PATH]

1. Start-up: ``caprl train --help`` (the training stage's imports: torch, MLflow, the stage's
   modules; nothing trained) as a command by itself and through ``caprl.cli.job_server``.
2. Tracking: a fresh Python process that does what a training job does with MLflow (one
   Tracker: params, 20 metric batches, tags, a text and a file artifact, the final status) and
   nothing else, in a scratch directory with a sqlite store: MLflow's own client in the job
   (as on a cluster node) vs the relay (``caprl.tracking.store``, as under a local Snakemake run).
The two ways alternate, so that both see the same machine. Prints wall seconds per job (median;
for the relay also the job's own CPU seconds) and the ratios measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from caprl.cli import job_server
from caprl.runtime import socket_service
from caprl.tracking import store as tracking_store

JOB = """
import resource
from pathlib import Path
from caprl.tracking import Tracker
Path("notes.txt").write_text("x")
with Tracker("caprl", "synthetic/bench/train") as t:
    t.log_params({"run": {"options": {"lr": 0.01, "epochs": 15}}, "seed": 1234})
    for step in range(20):
        t.log_metrics({"train/loss": 1.0 / (step + 1), "train/lr": 0.01}, step=step)
    t.set_tags({"best.epoch": 3})
    t.log_text("config", "config.yaml")
    t.log_artifact("notes.txt")
    assert t.active
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


def one_job(cwd: Path, relay: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the job itself) of one tracked job."""
    env = {k: v for k, v in os.environ.items() if k != tracking_store.SOCKET_ENV}
    env["MLFLOW_TRACKING_URI"] = "sqlite:///mlflow.db"
    if relay:
        env[tracking_store.SOCKET_ENV] = relay
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", JOB], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, float(proc.stdout.strip().splitlines()[-1])


def one_command(server: str | None) -> float:
    """Wall seconds of ``caprl train --help``, by itself or through the job server at ``server``."""
    env = {k: v for k, v in os.environ.items() if k != job_server.SOCKET_ENV}
    if server:
        env[job_server.SOCKET_ENV] = server
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "caprl", "train", "--help"], env=env, capture_output=True, check=True)
    return time.perf_counter() - started


def startup(jobs: int) -> dict[str, float]:
    path = socket_service.workflow_socket_path("jobs-bench")
    proc = job_server.start(path)
    try:
        while not socket_service.live_server_at(path):  # it preloads first
            if proc.poll() is not None:
                raise SystemExit("the job server did not start")
            time.sleep(0.1)
        rows: dict[str, list[float]] = {"by itself": [], "job server": []}
        for _ in range(jobs):
            rows["by itself"].append(one_command(None))
            rows["job server"].append(one_command(path))
    finally:
        socket_service.stop(path, job_server.SERVER_MODULE, what=job_server.WHAT)
        socket_service.stop_process(proc)
    return {kind: statistics.median(r) for kind, r in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6, help="jobs of each kind (alternating)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    started = startup(args.jobs)
    print(f"{'caprl train --help':<20} {'wall s/job':>10}")
    for kind, wall in started.items():
        print(f"{kind:<20} {wall:>10.2f}")
    print(f"job server / by itself: {started['job server'] / started['by itself']:.2f}x ({args.jobs} each, median)\n")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        here = Path.cwd()
        os.chdir(work)
        path = socket_service.workflow_socket_path("mlflow-bench")
        proc = tracking_store.start(path, "sqlite:///mlflow.db")
        os.chdir(here)
        try:
            one_job(work, None)  # the store's schema is created once, outside the timing
            rows: dict[str, list[tuple[float, float]]] = {"direct": [], "relay": []}
            for _ in range(args.jobs):
                rows["direct"].append(one_job(work, None))
                rows["relay"].append(one_job(work, path))
        finally:
            socket_service.stop(path, tracking_store.SERVER_MODULE, what=tracking_store.WHAT)
            socket_service.stop_process(proc)
    result = {kind: {"wall_s": statistics.median(w for w, _ in r), "cpu_s": statistics.median(c for _, c in r)}
              for kind, r in rows.items()}
    print(f"{'tracking':<8} {'wall s/job':>10} {'CPU s/job':>10}")
    for kind, r in result.items():
        print(f"{kind:<8} {r['wall_s']:>10.2f} {r['cpu_s']:>10.2f}")
    print(f"relay / direct: wall {result['relay']['wall_s'] / result['direct']['wall_s']:.2f}x, "
          f"CPU {result['relay']['cpu_s'] / result['direct']['cpu_s']:.2f}x ({args.jobs} jobs each, median)")
    if args.json:
        args.json.write_text(json.dumps({"jobs": args.jobs, "startup_wall_s": started, "tracking": result},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
