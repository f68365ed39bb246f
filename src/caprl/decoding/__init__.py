"""Batched decoding for every registered model, as a toolkit.

* :func:`start` begins a decode for a batch (``n`` rows per image) and returns a
  :class:`DecodeState`; :func:`rollout` continues ANY state for a number of steps, by
  greedy choice, sampling, or a relaxed (straight-through / soft) estimator. ``sample`` is
  ``start`` + ``rollout``.
* :func:`rollouts_from_prefixes` continues every prefix of a batch of sampled captions
  ``k`` times, all in one batch (Monte-Carlo roll-outs, PG-SPIDEr).
* :class:`Samples` carries each step's tokens, log-probabilities, mask, entropy, and on
  request the hidden state the output layer read and the relaxed (soft) one-hot rows.
* With an estimator, what each row reads at the next step is a feed mode (:data:`FEEDS`):
  its sampled word, its relaxed distribution (PSST as the paper writes it) or the row it
  passes on (PSST as the authors' code runs it).
* Decoders used for evaluation are chosen by name (:data:`DECODERS`), each with the ``decode:``
  options it reads (:mod:`caprl.decoding.options`: constraints, length penalty, diverse groups,
  top-k / top-p sampling; all off by default); :func:`decode_split`
  (:mod:`caprl.decoding.split`) is the one "decode a split in batches" loop (validation,
  evaluation, figures).

Every tensor made here takes the device of the context; on CUDA the loop never waits for
the device (no early exit test, which would synchronise), on CPU it stops when every row
has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from caprl.decoding import captured, selection
from caprl.errors import CaprlError
from caprl.decoding.constraints import Rule
from caprl.decoding.live_rows import LiveRows
from caprl.decoding.options import DecodeOptions, read_options
from caprl.decoding.sampling import GeneratorNoise, GumbelNoise, Noise, sampling_rule  # noqa: F401  (decoding.Noise)
from caprl.decoding.split import decode_split  # noqa: F401  (caprl.decoding.decode_split)
from caprl.models.base import Batch, CaptionModel, batch_tensors, map_batch
from caprl.registry import Registry
from caprl.decoding.relaxation import (ESTIMATORS, FEEDS, Estimator, RelaxedStep, partial_mask, partial_token_mask,  # noqa: F401
                              relaxed_at)


@dataclass
class Samples:
    """Decoded captions of every stage.

    ``tokens [N, S, T]`` (0 after a caption's end), ``logprobs [N, S, T]`` of the chosen
    tokens (differentiable unless decoded under no_grad), ``mask [N, S, T]`` (1 for tokens
    that belong to the caption, its end token included), ``attention [N, S, T, R]`` or None;
    on request the ``entropy [N, S, T]`` of each step's distribution (masked),
    ``hidden [N, S, T, H]`` and relaxed rows ``soft [N, S, T, V]``; ``after[t]`` is the
    decode state after step t (to continue any prefix, see :func:`rollout`).
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    soft: torch.Tensor | None = None
    after: list["DecodeState"] = field(default_factory=list)

    def last_stage(self) -> torch.Tensor:
        return self.tokens[:, -1]


@dataclass
class DecodeState:
    """Where a batch of decodes stands: the model state, each row's previous word, which
    rows have ended, and the number of words emitted so far."""

    ctx: Batch
    state: tuple[torch.Tensor, ...]
    prev: torch.Tensor  # [N, S] token ids, or [N, S, V] rows (a relaxed feed: see FEEDS)
    finished: torch.Tensor  # [N, S] bool
    t: int = 0


def expand(ctx: Batch, n: int) -> Batch:
    """Repeat every image's context ``n`` times (image-major: rows i*n .. i*n+n-1); a per-image
    :class:`~caprl.models.base.Shared` entry repeats its row map, not its data."""
    return ctx if n == 1 else map_batch(lambda t: t.repeat_interleave(n, dim=0), ctx)


def _first(obj: Batch) -> torch.Tensor:
    return next(batch_tensors(obj))


def start(model: CaptionModel, ctx: Batch, n: int = 1) -> DecodeState:
    """Begin ``n`` decodes per image from the start token."""
    ctx = expand(ctx, n)
    first = _first(ctx)
    rows, stages = first.shape[0], model.n_stages
    return DecodeState(
        ctx=ctx,
        state=model.init_state(ctx),
        prev=torch.zeros(rows, stages, dtype=torch.long, device=first.device),
        finished=torch.zeros(rows, stages, dtype=torch.bool, device=first.device),
    )


def rollout(
    model: CaptionModel,
    at: DecodeState,
    steps: int,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    noise: GumbelNoise | None = None,
    per_image: int = 1,
    estimator: Estimator | None = None,
    relaxed: torch.Tensor | None = None,
    feed: str = "word",
    keep_entropy: bool = False,
    keep_hidden: bool = False,
    keep_states: bool = False,
    rule: Rule | None = None,
) -> Samples:
    """Continue the decodes of ``at`` for up to ``steps`` words (``at`` is not modified).

    Choice of each word: argmax (``greedy``), an ``estimator``, Gumbel-max with ``noise``
    (``per_image`` rows per image of the global batch), or the global torch RNG. Rows that
    already ended emit 0 at no cost (and read 0 at the next step).

    With an ``estimator``, ``Samples.soft`` holds the row each caption passes on at each step:
    the straight-through one-hot, or the relaxed distribution where ``relaxed`` is True
    (``[N]``: per caption; ``[N, >= steps]``: per token, column i for this rollout's step i;
    a bool mask on the model's device). ``feed`` (a name in :data:`FEEDS`) says what each row
    reads at the next step: ``word`` (its sampled word), ``relaxed`` (relaxed rows their
    relaxed distribution, the others their word) or ``straight_through`` (every row the row
    it passes on). Nothing in the loop reads the device back (on CUDA).

    ``rule`` (evaluation's constraints and truncation: :mod:`caprl.decoding.constraints`,
    :func:`caprl.decoding.sampling.sampling_rule`) edits each step's log-probabilities of the rows
    that have not ended, given the words this rollout emitted (a decoder's rollout starts at the
    start token); what is left is renormalised and chosen from. A row whose every word it bans
    takes that step unconstrained.
    """
    if feed != "word" and estimator is None:
        raise CaprlError(f"rollout: feed {feed!r} needs an estimator")
    feed_fn = FEEDS.get(feed, where="rollout.feed")
    state, prev, finished = at.state, at.prev, at.finished
    rows = prev.shape[0]
    relaxed_of = relaxed_at(relaxed, rows, steps) if estimator is not None else (lambda i: None)
    stop_early = prev.device.type == "cpu"  # on CUDA, .all() would wait for the device
    # on a CPU, ended rows leave the batch (caprl.decoding.live_rows: the noise and dropout masks stay the full
    # batch's); not where every row's state or hidden is kept, nor for an estimator's relaxed rows or
    # the global RNG's samples (drawn per stepped row)
    live_rows = LiveRows(rows, stop_early and estimator is None and not keep_states and not keep_hidden
                         and (greedy or noise is not None))
    ctx = at.ctx
    tokens, logprobs, masks, entropies, attentions, hiddens, softs, after = [], [], [], [], [], [], [], []
    for i in range(steps):
        with live_rows.stepping():
            out = model.step(prev, ctx, state)
        state = out.state
        scaled = out.logprobs if temperature == 1.0 else torch.log_softmax(out.logprobs / temperature, dim=-1)
        if rule is not None:
            history = live_rows.of(torch.stack(tokens, dim=2)) if tokens else prev.new_zeros(*scaled.shape[:2], 0)
            scaled = _ruled(scaled, rule, history, finished, i == steps - 1)
        fed: torch.Tensor | None = None
        if greedy:
            word = scaled.argmax(dim=-1)
        elif estimator is not None:
            relaxed_step = RelaxedStep(*estimator(scaled), relaxed=relaxed_of(i))
            softs.append(relaxed_step.passed())
            word, fed = feed_fn(relaxed_step)
        elif noise is not None:
            gumbel = live_rows.of(noise.gumbel(at.t + i, rows, per_image, tuple(scaled.shape[1:]), scaled.device))
            word = (scaled.detach() + gumbel).argmax(dim=-1)
        else:
            word = torch.multinomial(scaled.detach().exp().view(-1, scaled.shape[-1]), 1).view(rows, -1)
        word = word.masked_fill(finished, 0)
        live = (~finished).to(scaled.dtype)
        masks.append(live_rows.full(live))
        logprobs.append(live_rows.full(scaled.gather(-1, word.unsqueeze(-1)).squeeze(-1) * live))
        if keep_entropy:
            entropies.append(live_rows.full(-(scaled.exp() * scaled).sum(dim=-1) * live))
        tokens.append(live_rows.full(word))
        if out.attention is not None:
            attentions.append(live_rows.full(out.attention))
        if keep_hidden:
            hiddens.append(out.hidden)
        finished = finished | (word == 0)
        if fed is not None:  # an ended row reads 0, as with ids
            fed = torch.where(finished.unsqueeze(-1), F.one_hot(word, fed.shape[-1]).to(fed.dtype), fed)
        prev = word if fed is None else fed
        if keep_states:
            after.append(DecodeState(at.ctx, state, prev, finished, at.t + i + 1))
        if stop_early and bool(finished.all()):
            break
        shrunk = live_rows.shrink(finished, ctx, state, prev, finished)
        if shrunk is not None:
            ctx, state, prev, finished = shrunk
    if noise is not None and not greedy and estimator is None:
        noise.calls += 1
    return Samples(
        tokens=_pad(torch.stack(tokens, dim=2), steps),
        logprobs=_pad(torch.stack(logprobs, dim=2), steps),
        mask=_pad(torch.stack(masks, dim=2), steps),
        entropy=_pad(torch.stack(entropies, dim=2), steps) if entropies else None,
        attention=torch.stack(attentions, dim=2) if attentions else None,
        hidden=torch.stack(hiddens, dim=2) if hiddens else None,
        soft=torch.stack(softs, dim=2) if softs else None,
        after=after,
    )


def _ruled(scaled: torch.Tensor, rule: Rule, history: torch.Tensor, finished: torch.Tensor, last: bool) -> torch.Tensor:
    """``scaled [R, S, V]`` edited by ``rule`` (``history [R, S, t]``) and renormalised; ended rows,
    and rows whose every word it bans, as they were."""
    rows, stages, vocab = scaled.shape
    ruled = rule(scaled.reshape(-1, vocab), history.reshape(rows * stages, history.shape[2]), last).view_as(scaled)
    keep = finished.unsqueeze(-1) | ~torch.isfinite(ruled).any(dim=-1, keepdim=True)
    return torch.log_softmax(torch.where(keep, scaled, ruled), dim=-1)


def sample(model: CaptionModel, ctx: Batch, max_length: int, n: int = 1, greedy: bool = False,
           temperature: float = 1.0, noise: GumbelNoise | None = None, **options: Any) -> Samples:
    """``n`` captions per image from every stage; each stage reads its own previous word."""
    return rollout(model, start(model, ctx, n), max_length, greedy=greedy, temperature=temperature, noise=noise,
                   per_image=n, **options)


def rollouts_from_prefixes(model: CaptionModel, samples: Samples, k: int, max_length: int,
                           noise: Noise | None = None, temperature: float = 1.0, per_image: int = 1) -> torch.Tensor:
    """Complete every prefix ``g_{1:t}`` (t = 1..T) of ``samples`` ``k`` times, in one batch.

    ``samples`` must come from :func:`rollout` with ``keep_states=True``. Returns tokens
    ``[N, T, K, S, max_length]``: row (i, t, k) is caption i's first t+1 words followed by
    roll-out k (a prefix that already ended is returned as it is). ``per_image``: rows of
    ``samples`` per image (image-major), for the roll-outs' noise.
    """
    states = samples.after
    n_rows, steps = samples.tokens.shape[0], len(states)
    joined = _interleave([s.state for s in states], k)
    at = DecodeState(
        ctx=map_batch(lambda x: x.repeat_interleave(steps * k, dim=0), states[0].ctx),
        state=joined,
        prev=_interleave([s.prev for s in states], k),
        finished=_interleave([s.finished for s in states], k),
    )
    cont = rollout(model, at, max_length - 1, temperature=temperature, noise=noise,
                   per_image=per_image * steps * k).tokens
    cont = cont.view(n_rows, steps, k, *cont.shape[1:])  # [N, T, K, S, L-1]
    out = cont.new_zeros(n_rows, steps, k, cont.shape[3], max_length)
    for t in range(steps):  # prefix t+1 words, then max_length - t - 1 continued words
        out[:, t, :, :, : t + 1] = samples.tokens[:, None, :, : t + 1]
        out[:, t, :, :, t + 1 :] = cont[:, t, :, :, : max_length - t - 1]
    return out


def _interleave(per_step: Sequence[Any], k: int) -> Any:
    """``T`` batches of ``[N, ...]`` -> one ``[N*T*K, ...]`` (image-major, then step, then copy)."""
    if isinstance(per_step[0], torch.Tensor):
        x = torch.stack(list(per_step), dim=1)  # [N, T, ...]
        x = x.repeat_interleave(k, dim=1)
        return x.reshape(-1, *x.shape[2:])
    return type(per_step[0])(_interleave([s[j] for s in per_step], k) for j in range(len(per_step[0])))


# --- decoders for evaluation, by name ------------------------------------------------------
Decoder = Callable[..., torch.Tensor]
DECODERS: Registry[Decoder] = Registry("decoder")


@DECODERS.register("greedy")
def greedy_decoder(model: CaptionModel, ctx: Batch, max_length: int, **settings: Any) -> torch.Tensor:
    """``[B, 1, T]``: the greedy caption of the last stage, under the constraints of ``settings``
    (:func:`caprl.decoding.options.read_options`); replayed from a CUDA graph under no_grad on a GPU
    (:mod:`caprl.decoding.captured`), constraints included."""
    constraints = read_options(settings, "greedy").constraints
    return captured.run(model, ("greedy", max_length, constraints),
                        lambda c: sample(model, c, max_length, greedy=True,
                                         rule=constraints.rule() if constraints else None),
                        ctx).last_stage().unsqueeze(1)


@DECODERS.register("sample")
def sample_decoder(model: CaptionModel, ctx: Batch, max_length: int, n: int = 1, temperature: float = 1.0,
                   generator: torch.Generator | None = None, **settings: Any) -> torch.Tensor:
    """``[B, n, T]``: ``n`` random samples per image at ``temperature``, under the constraints,
    ``top_k`` and ``top_p`` of ``settings`` (:mod:`caprl.decoding.sampling`); drawn from
    ``generator`` (on the model's device, seeded from params ``seed``: reruns agree), else from
    the global RNG (seed it for reruns). Eager (not captured: a draw advances its generator)."""
    opts = read_options({**settings, "temperature": temperature}, "sample")
    out = sample(model, ctx, max_length, n=n, temperature=opts.temperature,
                 noise=GeneratorNoise(generator) if generator is not None else None,
                 rule=sampling_rule(opts.constraints, opts.top_k, opts.top_p)).last_stage()
    return out.view(-1, n, out.shape[-1])


@DECODERS.register("beam")
def beam_decoder(model: CaptionModel, ctx: Batch, max_length: int, beam_size: int = 5, **settings: Any) -> torch.Tensor:
    """``[B, 1, T]``: the best beam (with the options of ``settings``: :func:`beam_search`)."""
    return captured_beams(model, ctx, beam_size, max_length, read_options(settings, "beam", beam_size))[0][:, :1]


@DECODERS.register("top_k_beams")
def top_k_beams_decoder(model: CaptionModel, ctx: Batch, max_length: int, beam_size: int = 5, n: int = 5,
                        **settings: Any) -> torch.Tensor:
    """``[B, n, T]``: the ``n`` best of ``beam_size`` beams (with the options of ``settings``)."""
    width = max(beam_size, n)
    return captured_beams(model, ctx, width, max_length, read_options(settings, "top_k_beams", width))[0][:, :n]


def captured_beams(model: CaptionModel, ctx: Batch, beam_size: int, max_length: int,
                   options: DecodeOptions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`beam_search`, replayed from a CUDA graph under no_grad on a GPU (:mod:`caprl.decoding.captured`):
    its loop reads nothing back there, whatever the options, so a whole search is one launch."""
    opts = options or DecodeOptions()
    return captured.run(model, ("beam", beam_size, max_length, opts),
                        lambda c: beam_search(model, c, beam_size, max_length, opts), ctx)


def beam_search(
    model: CaptionModel, ctx: Batch, beam_size: int, max_length: int, options: DecodeOptions | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched beam search on the last stage; every stage is fed the beam's words.

    Returns ``tokens [B, K, T]`` sorted best first and their scores ``[B, K]``: the summed
    log-probabilities, under ``options``' length penalty. ``options`` (default: all off, the
    hypothesis with the highest log-probability wins): constraints, which ban words without
    renormalising (:mod:`caprl.decoding.constraints`), a length penalty and diverse groups
    (:mod:`caprl.decoding.selection`).

    With diverse groups the beams come group by group, each group's best first by its selection
    score (its log-probability plus its diversity terms, under the length penalty), as
    self-critical.pytorch's ``beam_search`` returns its ``done_beams`` (each group's list sorted by
    ``p``, the groups concatenated in order) and its ``_sample_beam`` takes ``done_beams[0]``: the
    caption returned (``beam``, ``tokens[:, 0]``) is the first group's best, the group that chose
    with no diversity term, not the beam of highest log-probability over all groups (which a later
    group, pushed off the first group's words, can find). The scores stay the plain
    log-probabilities, so they are not in decreasing order across groups.
    """
    opts = options or DecodeOptions()
    k = beam_size
    if k % opts.groups:
        raise CaprlError(f"decode.groups: {opts.groups} groups do not divide the {k} beams (decode.beam_size)")
    penalty = selection.LENGTH_PENALTIES.get(opts.length_penalty, where="decode.length_penalty")
    rule = opts.constraints.rule() if opts.constraints else None
    ctx_k = expand(ctx, k)
    state = model.init_state(ctx_k)
    first = _first(ctx)
    batch, device = first.shape[0], first.device
    stop_early = device.type == "cpu"
    # built whole, not by item assignment: a Python number written into a CUDA tensor is a host copy,
    # which a CUDA graph cannot capture (caprl.decoding.captured)
    unreached = torch.full((batch, k), float("-inf"), device=device)
    live = torch.arange(k, device=device) % (k // opts.groups) == 0
    scores = torch.where(live, torch.zeros_like(unreached), unreached)  # one live beam (per group) at the start
    selecting = scores  # what beams are chosen by: scores, plus the diversity terms of diverse groups
    lengths = torch.zeros(batch, k, device=device)  # each beam's tokens, its end token included
    finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    tokens = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    prev = torch.zeros(batch * k, dtype=torch.long, device=device)
    base = (torch.arange(batch, device=device) * k).unsqueeze(1)
    ended: torch.Tensor | None = None
    for t in range(max_length):
        out = model.step(prev.unsqueeze(1).expand(-1, model.n_stages), ctx_k, state)
        logprobs = out.logprobs[:, -1].reshape(batch, k, -1)
        vocab = logprobs.shape[-1]
        if ended is None:  # a finished beam can only repeat the end token, at no cost
            ended = torch.cat([logprobs.new_zeros(1), logprobs.new_full((vocab - 1,), float("-inf"))])
        if rule is not None:
            logprobs = rule(logprobs.reshape(batch * k, vocab), tokens.reshape(batch * k, tokens.shape[2]),
                            t == max_length - 1).view(batch, k, vocab)
        logprobs = torch.where(finished.unsqueeze(-1), ended, logprobs)
        grown = torch.where(finished, lengths, lengths + 1)
        chosen = selection.choose(selecting, logprobs, finished, grown, penalty, opts.length_alpha, opts.groups,
                                  opts.diversity_lambda)
        beam, word = chosen.beam, chosen.word
        scores = chosen.selecting if opts.groups == 1 else (
            scores.gather(1, beam) + logprobs.reshape(batch, -1).gather(1, beam * vocab + word))
        selecting = chosen.selecting
        order = (base + beam).view(-1)
        state = map_batch(lambda x: x.index_select(0, order), out.state)
        tokens = torch.cat([tokens.gather(1, beam.unsqueeze(-1).expand(-1, -1, tokens.shape[2])), word.unsqueeze(-1)], -1)
        lengths = grown.gather(1, beam)
        finished = finished.gather(1, beam) | (word == 0)
        prev = word.view(-1)
        if stop_early and bool(finished.all()):
            break
    final = penalty(scores, lengths, opts.length_alpha)
    order = final.argsort(dim=1, descending=True) if opts.groups == 1 else _group_order(
        penalty(selecting, lengths, opts.length_alpha), opts.groups)
    tokens = tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, tokens.shape[2]))
    return _pad(tokens, max_length), final.gather(1, order)


def _group_order(ranked: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, K]`` beam order: group by group, within a group by ``ranked`` (highest first), as
    self-critical.pytorch's ``done_beams`` of diverse beam search."""
    batch, k = ranked.shape
    per = k // groups
    within = ranked.view(batch, groups, per).argsort(dim=2, descending=True)
    offsets = (torch.arange(groups, device=ranked.device) * per).view(1, groups, 1)
    return (within + offsets).view(batch, k)


def _pad(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[-1] >= length:
        return x
    pad = x.new_zeros(*x.shape[:-1], length - x.shape[-1])
    return torch.cat([x, pad], dim=-1)
