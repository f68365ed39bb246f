"""What a pipeline job pays before it works: by itself vs through a local run's job server.

    python benchmarks/job_startup.py [--jobs N] [--json PATH]

``caprl train --help`` (the training stage's imports: torch, MLflow, the stage's modules; nothing
trained) as a command by itself and through ``caprl.cli.job_server``. The two ways alternate, so
that both see the same machine. Prints wall seconds per job (median) and the ratio measured in
this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from caprl.cli import job_server
from caprl.runtime import socket_service

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
    print(f"job server / by itself: {started['job server'] / started['by itself']:.2f}x ({args.jobs} each, median)")
    if args.json:
        args.json.write_text(json.dumps({"jobs": args.jobs, "startup_wall_s": started}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
