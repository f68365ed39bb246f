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


class MemoizedReward(Reward):
    """A reward whose score of a caption depends only on the caption and its image's references
    (METEOR, ROUGE-L, SPICE: one external or pure-Python score per caption), so each distinct
    (image id, caption) pair is scored once and remembered.

    Sampled captions repeat (a policy's samples, PG-SPIDEr's roll-outs and the greedy caption
    often agree), and these scorers cost milliseconds per caption. The cache holds at most
    ``cache_size`` pairs and is emptied when full (a paper-scale run's pairs do not all fit).
    Subclasses implement :meth:`score`; the numbers are the scorer's own, only fewer are asked.
    """

    cache_size = 1_000_000

    def __init__(self) -> None:
        self._cache: dict[tuple[int, tuple[str, ...]], float] = {}
        self.scored = 0  # captions the scorer was asked for (the rest came from the cache)

    @abc.abstractmethod
    def score(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        """The scorer's own score of each caption (no cache)."""

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        self.check_batch(image_ids, captions)
        keys = [(int(i), tuple(c)) for i, c in zip(image_ids, captions)]
        values = {k: self._cache[k] for k in keys if k in self._cache}
        new = [k for k in dict.fromkeys(keys) if k not in values]
        if new:
            values.update(zip(new, map(float, self.score([k[0] for k in new], [list(k[1]) for k in new]))))
            self.scored += len(new)
            if len(self._cache) + len(new) > self.cache_size:
                self._cache.clear()
            self._cache.update((k, values[k]) for k in new)
        return np.array([values[k] for k in keys], dtype=np.float64)
