"""The CIDEr-D benchmark script runs, agrees with pycocoevalcap, and its n-gram table never grows.

The speed-up itself is a measurement, reported by ``python benchmarks/rewards.py`` (not asserted here).
"""

from __future__ import annotations

import re
import subprocess
import sys

from conftest_rewards import REPO, coco_path


def test_benchmark_speedup_and_memory():
    coco_path()  # skip with the reason if the shared data is absent
    done = subprocess.run(
        [sys.executable, "benchmarks/rewards.py", "--batches", "4", "--repeats", "1", "--growth-batches", "120"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ratio = float(re.search(r"ratio \(caprl / pycocoevalcap\)\s+([\d.]+)x", done.stdout).group(1))
    traced = [float(x) for x in re.findall(r"([\d.]+) MiB after \d+", done.stdout)]
    growth = traced[-1] - traced[0]
    assert ratio > 0, done.stdout
    agreement = float(re.search(r"max \|caprl - pycocoevalcap\| on batch 0: ([\d.e+-]+)", done.stdout).group(1))
    assert agreement < 1e-9, done.stdout
    assert len(traced) == 4 and growth < 0.5, done.stdout
    assert "(unchanged: True)" in done.stdout

