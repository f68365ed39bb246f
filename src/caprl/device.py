"""Which device a single-process stage (evaluate, figures) runs on."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """The GPU this process was given (CUDA_VISIBLE_DEVICES, e.g. by SLURM), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
