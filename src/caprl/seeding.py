"""One place to seed every random number generator a stage uses."""

from __future__ import annotations

import random
import sys

import numpy as np


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    deterministic_algorithms()


def deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without its import of
    torch._inductor's config, which costs ~1.5 s of CPU in every pipeline job (measured here:
    a tiny training job 11.6 s, of which its training 0.4 s). caprl compiles nothing; where
    inductor is already loaded (or torch lacks the switch) torch's own call sets its flag too."""
    import torch

    switch = getattr(torch._C, "_set_deterministic_algorithms", None)
    if switch is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        switch(True, warn_only=True)
