"""A toy vocabulary and hand-checkable rewards shared by the objective tests."""

from __future__ import annotations

import numpy as np
import torch

WORDS = ["<eos>", "a", "red", "circle", "blue", "square"]


def decode(tokens: torch.Tensor) -> list[list[str]]:
    """Token ids ``[N, T]`` -> words, up to each row's end token."""
    out = []
    for row in tokens.tolist():
        words = []
        for t in row:
            if t == 0:
                break
            words.append(WORDS[t])
        out.append(words)
    return out


def count_red(image_ids, captions) -> np.ndarray:
    """A hand-made reward: how many times 'red' was said (easy to check by hand)."""
    return np.array([c.count("red") for c in captions], dtype=np.float64)
