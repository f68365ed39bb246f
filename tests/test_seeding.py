"""seed_everything: the same draws for the same seed, deterministic algorithms on (warn only),
and no import of torch._inductor on the way (it costs every pipeline job ~1.5 s)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys, random
import numpy as np, torch
from caprl.seeding import seed_everything
seed_everything(7)
draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
assert torch.are_deterministic_algorithms_enabled(), "deterministic algorithms are off"
assert torch.is_deterministic_algorithms_warn_only_enabled(), "not warn-only"
{after}
print(repr(draws))
"""


def run(after: str = "") -> str:
    done = subprocess.run([sys.executable, "-c", CHECK.format(after=after)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_seeded_draws_repeat_and_inductor_is_not_imported() -> None:
    first = run('assert "torch._inductor.config" not in sys.modules, "inductor was imported"')
    assert run() == first


def test_a_loaded_inductor_gets_the_deterministic_flag_too() -> None:
    code = CHECK.replace("from caprl.seeding", "import torch._inductor.config as ic\nfrom caprl.seeding")
    done = subprocess.run([sys.executable, "-c", code.format(after="assert ic.deterministic is True")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
