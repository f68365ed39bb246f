"""Stand-in for a resumable training job, run by tests/slurm/resume/Snakefile.

    python3 resume_job.py CASE OUTPUT

First start: records ``started`` and waits (up to 5 minutes). On SIGTERM or SIGUSR1 it
writes ``state/CASE`` and exits with 128 + the signal number, as ``caprl train`` does.
A start that finds the state records ``resumed`` and writes OUTPUT. Every event is a line
``<SLURM job id> <event>`` in ``events/CASE.log``.
"""

import os
import signal
import sys
import time
from pathlib import Path

case, output = sys.argv[1], Path(sys.argv[2])
state = Path("state") / case
events = Path("events") / f"{case}.log"


def record(event: str) -> None:
    events.parent.mkdir(exist_ok=True)
    with events.open("a") as f:
        f.write(f"{os.environ.get('SLURM_JOB_ID', '-')} {event}\n")


def save_and_exit(signum: int, _frame: object) -> None:
    state.parent.mkdir(exist_ok=True)
    state.write_text("saved\n")
    record(f"signal {signum}: state saved")
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, save_and_exit)
signal.signal(signal.SIGUSR1, save_and_exit)

if state.exists():
    record("resumed")
    output.parent.mkdir(exist_ok=True)
    output.write_text("done\n")
    sys.exit(0)

record("started")
time.sleep(300)
record("never interrupted")
sys.exit(1)
