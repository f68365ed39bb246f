"""A toy captioner over a handful of words whose every step's log-probabilities are a fixed
function of the image and the whole prefix (float64), and the brute-force search of all its
captions that the decoding options are checked against (tests/test_decode_options.py,
tests/test_decode_sampling.py)."""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import torch

from caprl.models.base import StepOutput

#: the toy vocabulary: the end token, two words that are bad endings ("a", "of"), two others, UNK last
WORDS = ["<eos>", "a", "red", "of", "circle", "UNK"]
BAD = {1, 3}


class TableModel:
    """``n_stages`` 1; the context is one number per image; the state codes the prefix exactly."""

    n_stages = 1

    def __init__(self, vocab: int = len(WORDS), eos_bias: float = 0.0, sharp: float = 2.0) -> None:
        self.vocab_size, self.eos_bias, self.sharp = vocab, eos_bias, sharp

    def init_state(self, ctx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.zeros_like(ctx),)

    def step(self, words: torch.Tensor, ctx: torch.Tensor, state: tuple[torch.Tensor, ...]) -> StepOutput:
        code = state[0] * (self.vocab_size + 1) + words[:, -1].to(ctx.dtype) + 1
        w = torch.arange(self.vocab_size, dtype=ctx.dtype, device=ctx.device)
        logits = self.sharp * torch.sin(1.37 * code[:, None] + 0.91 * w * (w + 1) + ctx[:, None] * (w + 2))
        logits = logits + self.eos_bias * (w == 0).to(ctx.dtype)
        return StepOutput(torch.log_softmax(logits, dim=-1).unsqueeze(1), (code,), None, logits.unsqueeze(1))


def images(n: int = 2) -> torch.Tensor:
    return torch.linspace(0.3, 1.9, n, dtype=torch.float64)


def step_logprobs(model: TableModel, image: float, prefix: Sequence[int]) -> list[float]:
    """The model's log-probabilities of the next word after ``prefix`` (one image, one row)."""
    ctx = torch.tensor([image], dtype=torch.float64)
    state = model.init_state(ctx)
    for word in [0, *prefix]:
        out = model.step(torch.tensor([[word]]), ctx, state)
        state = out.state
    return out.logprobs[0, 0].tolist()


def repeats_a_trigram(words: Sequence[int]) -> bool:
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(grams) != len(set(grams))


Allowed = Callable[[Sequence[int]], bool]


def every_caption(model: TableModel, image: float, max_length: int) -> list[tuple[tuple[int, ...], float, int]]:
    """Every caption (its words), its summed log-probability (end token included; summed in
    order, as a search sums) and its length |Y| (tokens, end token included): those that end,
    and those cut at ``max_length`` words."""
    ctx = torch.tensor([image], dtype=torch.float64)
    after: dict[tuple[int, ...], tuple[tuple[torch.Tensor, ...], list[float]]] = {}

    def step(prefix: tuple[int, ...]) -> tuple[tuple[torch.Tensor, ...], list[float]]:
        """The state after ``prefix`` and the next word's log-probabilities (each prefix stepped once)."""
        if prefix not in after:
            state = step(prefix[:-1])[0] if prefix else model.init_state(ctx)
            out = model.step(torch.tensor([[prefix[-1] if prefix else 0]]), ctx, state)
            after[prefix] = (out.state, out.logprobs[0, 0].tolist())
        return after[prefix]

    found = []
    for n in range(max_length + 1):
        for prefix in itertools.product(range(1, model.vocab_size), repeat=n):
            score = 0.0
            for i, w in enumerate(prefix):
                score += step(prefix[:i])[1][w]
            found.append((prefix, score + step(prefix)[1][0], n + 1) if n < max_length else (prefix, score, n))
    return found


def best_captions(captions: list[tuple[tuple[int, ...], float, int]], allowed: Allowed,
                  rank: Callable[[float, int], float]) -> list[tuple[tuple[int, ...], float]]:
    """The allowed ones of ``captions`` (:func:`every_caption`), best first by ``rank(score,
    length)``, with that ranking score."""
    return sorted(((words, rank(score, length)) for words, score, length in captions if allowed(words)),
                  key=lambda c: -c[1])


def words_of(row: Sequence[int]) -> tuple[int, ...]:
    """A decoded row's words, up to its end token."""
    out = []
    for t in row:
        if t == 0:
            break
        out.append(int(t))
    return tuple(out)
