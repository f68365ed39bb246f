"""Lookahead inference (paper 003 sec. 3.3: "the value network makes decisions on whether to
choose the action given by the policy network"; the paper gives no formula, so we follow Ren
et al., CVPR 2017, sec. 3.4): beam search whose score mixes the policy and the value network.

Extending beam b (summed log-probability L_b so far) by word w scores

    lam * (L_b + log pi(w | s_t)) + (1 - lam) * v(s_{t+1}),     s_{t+1} = s_t + w,

and the ``beam_size`` best extensions of all beams of an image are kept (Ren et al. report lam
= 0.4 best). The value network is stepped only for the ``candidates`` most likely words of each
beam under the policy (all words when ``candidates`` >= the vocabulary; never fewer than
``beam_size``, so the beams cannot run out of candidates); other words are not extended. A beam
that has ended only repeats the end token at no cost (as :func:`caprl.decoding.beam_search`),
and its value stays the one it had when it ended. The final beams are ranked by the same
score. With lam = 1 the value adds exactly 0 and the search is :func:`caprl.decoding.beam_search`,
step for step (same layout, same tie-breaking).

Registered as decoder ``lookahead`` in :data:`caprl.decoding.DECODERS`; it needs the value
network (``value=``, any object with ``start``/``step``/``value`` as
:class:`caprl.objectives.value.ValueNetwork`) and the images' pooled features (``pooled=``),
which the evaluation passes (:func:`caprl.evaluation.run.decoded_sets`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from caprl.decoding import DECODERS, _first, _pad, expand
from caprl.decoding.options import read_options
from caprl.errors import CaprlError
from caprl.models.base import Batch, CaptionModel, map_batch


class Critic(Protocol):
    def start(self, pooled: torch.Tensor) -> Any: ...

    def step(self, state: Any, words: torch.Tensor) -> Any: ...

    def value(self, state: Any) -> torch.Tensor: ...


def lookahead_search(model: CaptionModel, ctx: Batch, value: Critic, pooled: torch.Tensor, beam_size: int,
                     max_length: int, lam: float = 0.4, candidates: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched lookahead beam search on the last stage (every stage is fed the beam's words).

    Returns ``tokens [B, K, T]`` sorted best first and their scores ``[B, K]``
    (lam * summed log-probability + (1 - lam) * value of the finished caption)."""
    if not 0.0 <= lam <= 1.0:
        raise CaprlError(f"lookahead: lam must be in [0, 1], got {lam}")
    k = beam_size
    ctx_k = expand(ctx, k)
    state = model.init_state(ctx_k)
    first = _first(ctx)
    batch, device = first.shape[0], first.device
    stop_early = device.type == "cpu"  # on CUDA, .all() would wait for the device
    critic = value.start(expand(pooled, k))
    held = value.value(critic).view(batch, k)  # v(s_t) of every beam (an ended beam keeps its own)
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
        summed = scores.unsqueeze(-1) + logprobs  # [B, K, V]: L_b + log pi(w)
        c = min(vocab, max(candidates, k))
        words = logprobs.topk(c, dim=-1).indices  # [B, K, c]
        stepped = value.step(map_batch(lambda t: t.repeat_interleave(c, dim=0), critic), words.reshape(-1))
        v = value.value(stepped).view(batch, k, c).to(summed.dtype)
        v = torch.where(finished.unsqueeze(-1), held.unsqueeze(-1).to(v.dtype), v)
        mixed = lam * summed + (1.0 - lam) * torch.zeros_like(summed).scatter(-1, words, v)  # lam = 1: + 0 exactly
        allowed = torch.zeros_like(summed, dtype=torch.bool).scatter(-1, words, True) & torch.isfinite(summed)
        mixed = mixed.masked_fill(~allowed, float("-inf"))
        top, index = mixed.view(batch, -1).topk(k, dim=1)
        beam, word = index // vocab, index % vocab
        order = (base + beam).view(-1)
        slot = torch.full_like(summed, -1, dtype=torch.long).scatter(
            -1, words, torch.arange(c, device=device).expand_as(words))
        chosen = slot.view(batch, -1).gather(1, index)  # which candidate of its beam each pick is
        state = map_batch(lambda t: t.index_select(0, order), out.state)
        critic = map_batch(lambda t: t.index_select(0, order * c + chosen.view(-1)), stepped)
        held = v.view(batch, -1).gather(1, beam * c + chosen).to(held.dtype)
        kept = tokens.gather(1, beam.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
        tokens = torch.cat([kept, word.unsqueeze(-1)], -1)
        finished = finished.gather(1, beam) | (word == 0)
        scores = summed.view(batch, -1).gather(1, index)
        prev = word.view(-1)
        if stop_early and bool(finished.all()):
            break
    final = lam * scores + (1.0 - lam) * held.to(scores.dtype)
    order = final.argsort(dim=1, descending=True)
    tokens = tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
    return _pad(tokens, max_length), final.gather(1, order)


@DECODERS.register("lookahead")
def lookahead_decoder(model: CaptionModel, ctx: Batch, max_length: int, beam_size: int = 5, value: Critic | None = None,
                      pooled: torch.Tensor | None = None, lam: float = 0.4, candidates: int = 10,
                      **settings: Any) -> torch.Tensor:
    """``[B, 1, T]``: the best beam of :func:`lookahead_search` (needs ``value`` and ``pooled``); it
    reads none of the ``decode:`` options (:mod:`caprl.decoding.options`) and refuses any set."""
    read_options(settings, "lookahead")
    if value is None or pooled is None:
        raise CaprlError("decode.method lookahead needs the run's value network and the images' pooled features: "
                         "only runs whose checkpoint holds a value network (actor_critic) can use it")
    return lookahead_search(model, ctx, value, pooled, beam_size, max_length, lam, candidates)[0][:, :1]
