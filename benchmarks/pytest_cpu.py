"""Where the test command's CPU goes: a pytest plugin that records each test's CPU seconds, and a report.

The test command's wall time on a 2-core machine is its CPU work over 2 cores (`pytest -n auto`
keeps both busy), so cutting it means cutting CPU, and wall times under xdist say little about
that (four workers share two cores; a test that waits on SLURM or a socket looks long). Record::

    PYTHONPATH=benchmarks CAPRL_TEST_CPU=/tmp/cpu.jsonl pytest -p pytest_cpu

one JSON line per test (setup, call and teardown together): ``wall``, ``self`` (the xdist worker's
user + system seconds) and ``children`` (those of the subprocesses it waited for: `caprl` jobs,
Snakemake, DVC; not daemons it leaves running, such as SLURM's, whose jobs are not counted). Report::

    python benchmarks/pytest_cpu.py /tmp/cpu.jsonl [--top 30]

prints the files by CPU seconds, their share of the counted total and their test counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

ENV = "CAPRL_TEST_CPU"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get(ENV)
    start, (own, children) = time.monotonic(), _cpu()
    yield
    if out:
        own_after, children_after = _cpu()
        line = {"id": item.nodeid, "wall": round(time.monotonic() - start, 3), "self": round(own_after - own, 3),
                "children": round(children_after - children, 3)}
        with open(out, "a", encoding="utf-8") as f:  # one short line per test: workers' appends do not mix
            f.write(json.dumps(line) + "\n")


def report(rows: list[dict[str, Any]], top: int) -> str:
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        entry = files[r["id"].split("::")[0]]
        entry[0] += r["self"] + r["children"]
        entry[1] += r["wall"]
        entry[2] += 1
    total = sum(v[0] for v in files.values())
    lines = [f"{len(rows)} tests, {total:,.0f} CPU s counted", "",
             "| file | CPU s | share | cumulative | tests | worker wall s |", "|---|---:|---:|---:|---:|---:|"]
    cumulative = 0.0
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        cumulative += cpu
        lines.append(f"| {name} | {cpu:,.0f} | {100 * cpu / total:.1f}% | {100 * cumulative / total:.1f}% | "
                     f"{n:.0f} | {wall:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the JSON lines $CAPRL_TEST_CPU collected")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.log.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(report(rows, args.top), end="")


if __name__ == "__main__":
    main()
