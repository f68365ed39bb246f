"""Batched decoding for every registered model: greedy, sampling and beam search.

All functions take an already-encoded context (``model.encode``) so that a caller that
needs both samples and a greedy baseline encodes the images once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from caprl.models.base import Batch, CaptionModel, map_batch


@dataclass
class Samples:
    """Decoded captions of every stage.

    ``tokens [N, S, T]`` (0 after a caption's end), ``logprobs [N, S, T]`` of the chosen
    tokens (differentiable unless decoded under no_grad), ``mask [N, S, T]`` (1 for tokens
    that belong to the caption, its end token included), ``attention [N, S, T, R]`` or None.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    attention: torch.Tensor | None

    def last_stage(self) -> torch.Tensor:
        return self.tokens[:, -1]


@dataclass
class Noise:
    """Sampling noise that depends only on (seed, step, call, global row).

    A batch split over several processes (DDP) draws, for its rows, exactly the noise one
    process would draw for the whole batch, so both sample the same captions. The image
    block this process holds is ``[offset, offset + its images)`` of ``total`` images.
    """

    seed: int
    step: int
    total: int
    offset: int = 0
    calls: int = 0

    def gumbel(self, t: int, rows: int, per_image: int, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((self.seed, self.step, self.calls, t)) % (2**63))
        u = torch.rand(self.total * per_image, *shape, generator=gen)
        start = self.offset * per_image
        u = u[start : start + rows].to(device)
        return -torch.log((-torch.log(u.clamp(min=1e-20))).clamp(min=1e-20))


def expand(ctx: Batch, n: int) -> Batch:
    """Repeat every image's context ``n`` times (image-major: rows i*n .. i*n+n-1)."""
    return ctx if n == 1 else map_batch(lambda t: t.repeat_interleave(n, dim=0), ctx)


def sample(
    model: CaptionModel,
    ctx: Batch,
    max_length: int,
    n: int = 1,
    greedy: bool = False,
    temperature: float = 1.0,
    noise: Noise | None = None,
) -> Samples:
    """``n`` captions per image from every stage; each stage reads its own previous word.

    Sampling draws from the global torch RNG, or, given ``noise``, by Gumbel-max with
    noise that is a function of the global row (see :class:`Noise`).
    """
    ctx = expand(ctx, n)
    state = model.init_state(ctx)
    first = next(t for t in _tensors(ctx))
    rows, stages = first.shape[0], model.n_stages
    prev = torch.zeros(rows, stages, dtype=torch.long, device=first.device)
    finished = torch.zeros(rows, stages, dtype=torch.bool, device=first.device)
    tokens, logprobs, masks, attentions = [], [], [], []
    for t in range(max_length):
        out = model.step(prev, ctx, state)
        state = out.state
        scaled = out.logprobs if temperature == 1.0 else torch.log_softmax(out.logprobs / temperature, dim=-1)
        if greedy:
            word = scaled.argmax(dim=-1)
        elif noise is not None:
            word = (scaled.detach() + noise.gumbel(t, rows, n, tuple(scaled.shape[1:]), scaled.device)).argmax(dim=-1)
        else:
            word = torch.multinomial(scaled.detach().exp().view(rows * stages, -1), 1).view(rows, stages)
        word = word.masked_fill(finished, 0)
        masks.append((~finished).to(scaled.dtype))
        logprobs.append(scaled.gather(-1, word.unsqueeze(-1)).squeeze(-1) * masks[-1])
        tokens.append(word)
        if out.attention is not None:
            attentions.append(out.attention)
        finished = finished | (word == 0)
        prev = word
        if bool(finished.all()):
            break
    if noise is not None and not greedy:
        noise.calls += 1
    return Samples(
        tokens=_pad(torch.stack(tokens, dim=2), max_length),
        logprobs=_pad(torch.stack(logprobs, dim=2), max_length),
        mask=_pad(torch.stack(masks, dim=2), max_length),
        attention=torch.stack(attentions, dim=2) if attentions else None,
    )


def beam_search(
    model: CaptionModel, ctx: Batch, beam_size: int, max_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched beam search on the last stage; every stage is fed the beam's words.

    Returns ``tokens [B, K, T]`` sorted best first and their summed log-probabilities
    ``[B, K]`` (no length penalty: the hypothesis with the highest log-probability wins).
    """
    k = beam_size
    ctx_k = expand(ctx, k)
    state = model.init_state(ctx_k)
    first = next(t for t in _tensors(ctx))
    batch, device = first.shape[0], first.device
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    tokens = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    prev = torch.zeros(batch * k, dtype=torch.long, device=device)
    base = (torch.arange(batch, device=device) * k).unsqueeze(1)
    for _ in range(max_length):
        out = model.step(prev.unsqueeze(1).expand(-1, model.n_stages), ctx_k, state)
        logprobs = out.logprobs[:, -1].reshape(batch, k, -1)
        vocab = logprobs.shape[-1]
        ended = torch.full_like(logprobs[0, 0], float("-inf"))
        ended[0] = 0.0  # a finished beam can only repeat the end token, at no cost
        logprobs = torch.where(finished.unsqueeze(-1), ended, logprobs)
        top_scores, top_index = (scores.unsqueeze(-1) + logprobs).view(batch, -1).topk(k, dim=1)
        beam, word = top_index // vocab, top_index % vocab
        order = (base + beam).view(-1)
        state = map_batch(lambda t: t.index_select(0, order), out.state)
        tokens = torch.cat([tokens.gather(1, beam.unsqueeze(-1).expand(-1, -1, tokens.shape[2])), word.unsqueeze(-1)], -1)
        finished = finished.gather(1, beam) | (word == 0)
        scores = top_scores
        prev = word.view(-1)
        if bool(finished.all()):
            break
    order = scores.argsort(dim=1, descending=True)
    tokens = tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
    return _pad(tokens, max_length), scores.gather(1, order)


def _tensors(obj: Batch):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)


def _pad(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[-1] >= length:
        return x
    pad = x.new_zeros(*x.shape[:-1], length - x.shape[-1])
    return torch.cat([x, pad], dim=-1)
