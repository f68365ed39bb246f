"""The reward interface shared by every reward and objective."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from caprl.errors import CaprlError


class Reward(abc.ABC):
    """A sequence-level reward: one float64 per (image id, tokenised caption) pair.

    Captions are lists of words (already tokenised and lower-cased like the references:
    no punctuation, no BOS/EOS tokens). Rewards that own external processes (METEOR's
    JVM) release them in :meth:`close`; rewards are also context managers.
    """

    name: str = "reward"

    @abc.abstractmethod
    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        """Score ``captions[i]`` against the references of ``image_ids[i]``."""

    def close(self) -> None:
        """Release external resources (no-op for in-process rewards)."""

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def check_batch(image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> None:
        if len(image_ids) != len(captions):
            raise CaprlError(f"reward: {len(image_ids)} image ids but {len(captions)} captions")
        for i, caption in enumerate(captions):
            if isinstance(caption, str):
                raise CaprlError(f"reward: caption {i} is a string; rewards take lists of words")
