"""Transformer captioner (Vaswani et al. 2017, "Attention is all you need"), as self-critical.pytorch
trains it (SCP: captioning/models/TransformerModel.py, the Annotated Transformer's code, and its recipe
configs/transformer/transformer.yml: 6 layers, d_model 512, 8 heads, d_ff 2048, dropout 0.1).

* Encoder: the regions ``[B, R, D]`` through ``Linear(D, d_model)``, ReLU and dropout ``feat_dropout``
  (SCP's ``att_embed``, its dropout SCP's ``drop_prob_lm``), then ``num_layers`` layers of
  self-attention and feed-forward, then a LayerNorm: the memory. No positional encoding over the
  regions (SCP's ``src_embed`` is the identity). The pooled vector is not read.
* Decoder: word embedding times sqrt(d_model) (Vaswani sec. 3.4) plus sinusoidal positions (sec. 3.5:
  sin on even, cos on odd features), dropout; ``num_layers`` layers of masked self-attention,
  cross-attention on the memory and feed-forward; a final LayerNorm; the output layer.
* Sublayers are pre-norm, ``x + dropout(sublayer(LayerNorm(x)))``, as SCP ("the norm is first as
  opposed to last"), not Vaswani's post-norm. Attention weights and the feed-forward's hidden
  layer have dropout ``dropout`` too (SCP). LayerNorm is torch's (eps 1e-6); SCP's divides by the
  unbiased standard deviation plus 1e-6, a difference of rounding size.
* The output layer is a ``Linear(d_model, V)`` of its own, not tied to the embedding: SCP's
  ``Generator`` has its own projection (Vaswani sec. 3.4 shares the two; SCP's recipe, which the
  numbers it reports come from, does not).
* Initialisation: Xavier uniform on every matrix of the encoder, decoder, embedding and output layer
  (SCP's ``make_model``); the region embedding, outside SCP's ``make_model``, keeps torch's default.

Decoding is incremental (:meth:`Transformer.core`): the state is ``(pos, k_1, v_1, ..., k_L, v_L)``,
``pos [N]`` the position of the word a row reads next, ``k_l``, ``v_l [N, H, C, d_k]`` layer l's keys
and values of the words read so far, in ``C = max_positions`` slots. A step embeds its one word,
projects only its query, key and value, writes the key and value into slot ``pos`` (into a new
tensor: an earlier state stays valid) and attends over the slots up to it. Its cost is the new
word's projections plus attention over C slots; nothing of the prefix is recomputed (SCP's ``core``
decodes the whole prefix again at every step). The slots are a fixed buffer so that a step's shapes
never depend on the step: a CUDA graph captures a whole decode (:mod:`caprl.decoding.captured`), and
states after different steps, rows at different positions, stack into one batch
(:func:`caprl.decoding.rollouts_from_prefixes`). Every state tensor is batch-first, so beam search's
reordering and a CPU decode's dropping of ended rows (:mod:`caprl.decoding.live_rows`) select rows of
the cache as they do of an LSTM's state. A row past the last slot overwrites it (no error: with
``max_positions`` >= ``max_length`` + 1 its words are past any decode's length, e.g. in PG-SPIDEr's
roll-outs, which drop them); XE checks that the captions fit. The memory's cross-attention keys and
values are projected once per image (:meth:`Transformer.encode`) and expanded with the rows.

Teacher forcing (XE) runs the whole sequence at once under a causal mask (:meth:`token_logprobs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from caprl.errors import CaprlError
from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, StepCore, register_model


@dataclass
class TransformerConfig:
    """Sizes (defaults: SCP's configs/transformer/transformer.yml; ``feat_dropout``: SCP's
    ``drop_prob_lm`` default, which the recipe leaves; ``max_positions``: COCO's 16 words + the end token)."""

    num_layers: int = 6  # encoder layers = decoder layers (SCP N_enc = N_dec)
    d_model: int = 512
    heads: int = 8  # SCP num_att_heads
    d_ff: int = 2048
    dropout: float = 0.1  # residual, attention-weight, feed-forward and position dropout
    feat_dropout: float = 0.5  # on the embedded regions
    max_positions: int = 17  # decode-cache slots: the longest caption + its end token

    @property
    def hidden_size(self) -> int:
        """The size of the hidden state objectives' baselines read (``StepCore.hidden``): d_model."""
        return self.d_model

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> "TransformerConfig":
        """:meth:`ModelConfig.from_dict`'s reading (an unknown key is an error naming those it takes),
        then the sizes' checks."""
        config: TransformerConfig = ModelConfig.from_dict.__func__(cls, values, where)  # type: ignore[attr-defined]
        for key in ("num_layers", "d_model", "heads", "d_ff", "max_positions"):
            value = getattr(config, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CaprlError(f"{where}.{key}: expected a positive integer, got {value!r}")
        if config.d_model % (2 * config.heads):
            raise CaprlError(f"{where}.d_model: {config.d_model} is not a multiple of 2 x heads ({config.heads}): "
                             "every head takes d_model / heads features, the positions sin/cos pairs")
        for key in ("dropout", "feat_dropout"):
            if not 0.0 <= getattr(config, key) < 1.0:
                raise CaprlError(f"{where}.{key}: expected a probability in [0, 1), got {getattr(config, key)!r}")
        return config


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, P, d]`` -> ``[B, H, P, d / H]``."""
    return x.view(*x.shape[:2], heads, -1).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, P, d_k]`` -> ``[B, P, H d_k]``."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
            dropout: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention (Vaswani eq. 1) ``[B, H, P, d_k]`` over ``S`` keys, and its
    weights ``[B, H, P, S]``; ``allowed`` (broadcast to ``[B, H, P, S]``) masks keys out."""
    scores = q.matmul(k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return dropout(weights).matmul(v), weights


class Attention(nn.Module):
    """Multi-head attention's four ``d_model -> d_model`` maps (query, key, value, output)."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = RowDropout(dropout)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and the values ``[B, H, P, d_k]`` of ``x [B, P, d]``."""
        return _heads(self.key(x), self.heads), _heads(self.value(x), self.heads)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention of queries from ``x [B, P, d]`` over keys and values ``[B, H, S, d_k]``:
        ``[B, P, d]``, and the weights."""
        out, weights = _attend(_heads(self.query(x), self.heads), k, v, allowed, self.dropout)
        return self.out(_merge(out)), weights


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = RowDropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.dropout(F.relu(self.w1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.attention, self.ff = Attention(c.d_model, c.heads, c.dropout), FeedForward(c.d_model, c.d_ff, c.dropout)
        self.norm1, self.norm2 = nn.LayerNorm(c.d_model, eps=1e-6), nn.LayerNorm(c.d_model, eps=1e-6)
        self.dropout = RowDropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.dropout(self.attention(h, *self.attention.keys_values(h), None)[0])
        return x + self.dropout(self.ff(self.norm2(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention on the memory, feed-forward; each pre-norm."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attention = Attention(c.d_model, c.heads, c.dropout)
        self.cross_attention = Attention(c.d_model, c.heads, c.dropout)
        self.ff = FeedForward(c.d_model, c.d_ff, c.dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c.d_model, eps=1e-6) for _ in range(3))
        self.dropout = RowDropout(c.dropout)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None, write: torch.Tensor | None,
                allowed: torch.Tensor, cross: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``x [B, P, d]`` through the layer: (its output, the self-attention's keys and values, the
        cross-attention's weights ``[B, H, P, R]``). Without ``cache`` the keys and values are those of
        ``x``'s P positions; with it (one position, P = 1) ``x``'s are written into the cache's keys and
        values ``[B, H, C, d_k]`` at the slots ``write [B, H, 1, d_k]`` (each row's, repeated), and the
        self-attention reads the cache."""
        h = self.norm1(x)
        k, v = self.self_attention.keys_values(h)
        if cache is not None:  # new tensors: the states of earlier steps stay as they were
            k, v = cache[0].scatter(2, write, k), cache[1].scatter(2, write, v)
        x = x + self.dropout(self.self_attention(h, k, v, allowed)[0])
        attended, weights = self.cross_attention(self.norm2(x), *cross, None)
        x = x + self.dropout(attended)
        return x + self.dropout(self.ff(self.norm3(x))), (k, v), weights


@register_model("transformer")
class Transformer(CaptionModel):
    config_class = TransformerConfig  # type: ignore[assignment]  # its own sizes, not ModelConfig's
    config: TransformerConfig

    def __init__(self, config: TransformerConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)  # type: ignore[arg-type]
        c = config
        self.feat_embed = nn.Sequential(nn.Linear(feat_dim, c.d_model), nn.ReLU(), RowDropout(c.feat_dropout))
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.num_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=1e-6)
        self.embed = nn.Embedding(vocab_size, c.d_model)
        self.embed_dropout = RowDropout(c.dropout)
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=1e-6)
        self.logit = nn.Linear(c.d_model, vocab_size)
        # Vaswani sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
        self.register_buffer("frequencies", torch.exp(torch.arange(0, c.d_model, 2).float()
                                                      * (-math.log(10000.0) / c.d_model)), persistent=False)
        self.register_buffer("slots", torch.arange(c.max_positions), persistent=False)
        for module in (self.encoder, self.embed, self.decoder, self.logit):
            for p in module.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    # --- the words' inputs -----------------------------------------------------------------
    def _inputs(self, words: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Embedded ``words`` (ids ``[B, P]``, or rows over the vocabulary ``[B, P, V]``, read as
        ``rows @ W``) times sqrt(d_model), plus the sinusoid of ``positions [B, P]``, dropout."""
        angles = positions.to(self.frequencies.dtype).unsqueeze(-1) * self.frequencies  # [B, P, d/2]
        position = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # sin on even, cos on odd
        return self.embed_dropout(ts.embedding(self.embed, words) * math.sqrt(self.config.d_model) + position)

    # --- CaptionModel ----------------------------------------------------------------------
    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        """The memory of each image and, per decoder layer, its cross-attention keys and values
        ``[B, H, R, d_k]`` (once per image, contiguous: decodes expand them with the rows)."""
        x = self.feat_embed(regions)
        for layer in self.encoder:
            x = layer(x)
        memory = self.encoder_norm(x)
        return {"cross": tuple(tuple(t.contiguous() for t in layer.cross_attention.keys_values(memory))
                               for layer in self.decoder)}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        cross = ctx["cross"][0][0]
        rows, heads, _, d_k = cross.shape
        cache = cross.new_zeros(rows, heads, self.config.max_positions, d_k)
        pos = torch.zeros(rows, dtype=torch.long, device=cross.device)
        return (pos, *(cache for _ in range(2 * len(self.decoder))))  # every slot free (none is read before written)

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        """One word per row (``words [N, 1]`` ids or ``[N, 1, V]`` rows) at each row's position
        ``state[0]``: its keys and values written into the caches, attention over the slots up to it."""
        pos, caches = state[0], state[1:]
        slot = pos.clamp(max=self.config.max_positions - 1).unsqueeze(1)  # [N, 1]
        write = slot.view(-1, 1, 1, 1).expand(-1, caches[0].shape[1], 1, caches[0].shape[3])
        allowed = (self.slots <= slot).view(pos.shape[0], 1, 1, -1)
        x = self._inputs(words[:, :1], pos.unsqueeze(1))  # [N, 1, d]
        written: list[torch.Tensor] = []
        for i, (layer, cross) in enumerate(zip(self.decoder, ctx["cross"])):
            x, kv, weights = layer(x, caches[2 * i : 2 * i + 2], write, allowed, cross)
            written += kv
        out = self.decoder_norm(x)  # [N, 1, d]
        # the last layer's cross-attention, averaged over its heads: what the figures show
        return StepCore(out, (pos + 1, *written), weights.mean(dim=1), out)

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, out)

    # --- the whole sequence at once (teacher forcing) ---------------------------------------
    def decode_all(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """The output layer's input ``[B, T+1, d]`` at every position of gold ``labels [B, T]``
        (position t reads the start token, then ``labels[:, t-1]``), under a causal mask."""
        batch, length = labels.shape
        if length + 1 > self.config.max_positions:
            raise CaprlError(f"models: transformer max_positions is {self.config.max_positions}; captions of "
                             f"{length} words and their end token need {length + 1} (vocab.max_length + 1)")
        words = torch.cat([labels.new_zeros(batch, 1), labels], dim=1)
        positions = torch.arange(length + 1, device=labels.device)
        x = self._inputs(words, positions.expand(batch, -1))
        allowed = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [P, P]: query t reads keys <= t
        for layer, cross in zip(self.decoder, ctx["cross"]):
            x = layer(x, None, None, allowed, cross)[0]
        return self.decoder_norm(x)

    def token_logprobs(self, ctx: Batch, labels: torch.Tensor, sample_prob: float = 0.0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """The base class's, from one pass over the whole sequence; under scheduled sampling (each
        input drawn from the step before) step by step through the cache, as the base class runs it."""
        if sample_prob > 0:
            return super().token_logprobs(ctx, labels, sample_prob, generator)
        return self.token_logprobs_fixed(ctx, labels)

    def token_logprobs_fixed(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """``[B, 1, T+1]``: the gold words' log-probabilities, 0 after each caption's end token; one
        pass, shapes set by ``labels``' and nothing read back (a CUDA graph captures it)."""
        batch, length = labels.shape
        logits = self.head(self.decode_all(ctx, labels))  # [B, T+1, V]
        gold = torch.cat([labels, labels.new_zeros(batch, 1)], dim=1)
        picked = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]), gold.reshape(-1),
                                  reduction="none").view(batch, length + 1)
        live = torch.arange(length + 1, device=labels.device) <= (labels > 0).sum(dim=1, keepdim=True)
        return (picked * live).unsqueeze(1)

    def teacher_forcing(self, ctx: Batch, labels: torch.Tensor) -> torch.Tensor:
        """``[B, 1, T+1, V]``: every word's log-probability at every position, in one pass."""
        return torch.log_softmax(self.head(self.decode_all(ctx, labels)), dim=-1).unsqueeze(1)
