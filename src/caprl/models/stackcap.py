"""Stack-Captioning (Gu et al., AAAI 2018): a coarse LSTM and ``n_fine`` attention LSTMs.

Stage 0 (coarse, eq. 1-2): ``h^0_t = LSTM_coarse(h^0_{t-1}, [y^0_{t-1}; f(V); h^{Nf}_{t-1}])``
with ``f(V)`` the mean of the region features (raw, as the paper's mean pooling of V) and
``h^{Nf}_{t-1}`` the last fine stage's previous hidden state.

Stage i >= 1 (fine, eq. 3-4): ``h^i_t = LSTM^i_fine(h^i_{t-1}, [y^i_{t-1}; g^i_t; h^{i-1}_t])``
where ``h^{i-1}_t`` is the preceding stage's hidden state at the same step (the coarse
LSTM's ``h^0_t`` for stage 1) and ``g^i_t = sum_n alpha^{i,n}_t (W^i_{va} V_n + b^i_{va})``
(eq. 5) with ``alpha^i_t = softmax(W^i_alpha A^i_t + b^i_alpha)``,
``A^{i,n}_t = tanh(W^i_va V_n + W^i_ha q^i_t)`` (eq. 6-7). The attention query is

* ``stackcap_star`` (independent attention): ``q^i_t = h^{i-1}_t``;
* ``stackcap`` (stacked attention, eq. 8): ``q^i_t = hbar^{i-1}_t = h^{i-1}_t +
  sum_n alpha^{i-1,n}_t (W^{i-1}_{va} V_n + b^{i-1}_{va})``, i.e. the previous stage's
  hidden state plus its attended feature ``g^{i-1}_t``; ``alpha^0 = 0`` so ``hbar^0 = h^0``.

Choices where the paper is silent: every stage reads its own previous word ``y^i_{t-1}``
through one shared embedding ``W_e``; every stage has its own output layer on its hidden
state (dropout before it); all hidden and cell states start at zero; ``W_va`` and
``W_ha`` have no bias (eq. 7 shows none) and the scalar ``b^i_alpha`` of eq. 6 is left out
because a softmax is invariant to it (it would never get a gradient). The coarse stage has no attention: its row of
``StepOutput.attention`` is zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from caprl.models import timeshared as ts
from caprl.models.attention import additive_scores, attend
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, Shared, StepCore, register_model, shared


@dataclass
class StackCapConfig(ModelConfig):
    att_hidden_size: int = 512
    n_fine: int = 2


class StageAttention(nn.Module):
    """One fine stage's spatial attention (eq. 5-7) for a given query ``q``."""

    def __init__(self, feat_dim: int, hidden_size: int, att_hidden_size: int) -> None:
        super().__init__()
        self.w_va = nn.Linear(feat_dim, att_hidden_size, bias=False)  # W^i_va
        self.w_ha = nn.Linear(hidden_size, att_hidden_size, bias=False)  # W^i_ha
        self.w_alpha = nn.Linear(att_hidden_size, 1, bias=False)  # W^i_alpha (b^i_alpha cancels in the softmax)
        self.w_value = nn.Linear(feat_dim, hidden_size)  # W^i_{v alpha}, b^i_{v alpha}

    def precompute(self, regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_va V [B, R, A], W_{v alpha} V + b [B, R, H])``, once per image."""
        return self.w_va(regions), self.w_value(regions)

    def forward(self, keys: torch.Tensor | Shared, values: torch.Tensor | Shared,
                query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g [B, H], alpha [B, R])`` from precomputed keys/values and the query ``[B, H]``."""
        scores = additive_scores(keys, ts.linear(self.w_ha, query, bias=None), self.w_alpha)
        alpha = torch.softmax(scores, dim=-1)
        return attend(alpha, values), alpha


class CoarseToFine(CaptionModel):
    """The coarse-to-fine decoder; subclasses choose the attention query (``attention_query``)."""

    config_class = StackCapConfig

    def __init__(self, config: StackCapConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        self.n_stages = 1 + c.n_fine
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.coarse = nn.LSTMCell(c.embed_size + feat_dim + c.hidden_size, c.hidden_size)
        self.mean_columns = slice(c.embed_size, c.embed_size + feat_dim)  # f(V)'s columns of the coarse input
        self.step_columns = (slice(0, self.mean_columns.start), slice(self.mean_columns.stop, None))  # the rest
        self.fine = nn.ModuleList(nn.LSTMCell(c.embed_size + 2 * c.hidden_size, c.hidden_size) for _ in range(c.n_fine))
        self.attend = nn.ModuleList(StageAttention(feat_dim, c.hidden_size, c.att_hidden_size) for _ in range(c.n_fine))
        self.logits = nn.ModuleList(nn.Linear(c.hidden_size, vocab_size) for _ in range(self.n_stages))
        self.dropout = RowDropout(c.dropout)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        """``mean`` = f(V) ``[B, D]``; ``keys``/``values``: one ``[B, R, A]``/``[B, R, H]`` per fine stage;
        ``mean_gates``: f(V)'s share of the coarse LSTM's gates, the same at every step, so
        projected once here (the coarse input is ``[y^0_{t-1}; f(V); h^{Nf}_{t-1}]``)."""
        keys, values = zip(*(att.precompute(regions) for att in self.attend))
        mean = regions.mean(dim=1)
        ctx = {"mean": mean, "keys": tuple(map(shared, keys)), "values": tuple(map(shared, values))}
        if type(self.coarse) is nn.LSTMCell:  # a replaced cell (tests) reads its whole input
            ctx["mean_gates"] = F.linear(mean, self.coarse.weight_ih[:, self.mean_columns])
        return ctx

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        """``(h^0, ..., h^{Nf}, c^0, ..., c^{Nf})``, each ``[B, H]``, all zeros: one tensor per
        stage, so that a stage reads its own state without a select (and its backward a copy)."""
        rows = ctx["mean"].shape[0]
        return tuple(ctx["mean"].new_zeros(rows, self.config.hidden_size) for _ in range(2 * self.n_stages))

    def attention_query(self, h_prev: torch.Tensor, g_prev: torch.Tensor | None) -> torch.Tensor:
        """The query of stage i from stage i-1's hidden state and attended feature (None for i = 1)."""
        raise NotImplementedError

    def attend_stage(self, stage: int, ctx: Batch, h_prev: torch.Tensor,
                     g_prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g^i_t, alpha^i_t)`` of fine stage ``stage`` (1..Nf) given ``h^{i-1}_t`` and ``g^{i-1}_t``."""
        query = self.attention_query(h_prev, g_prev if stage > 1 else None)
        return self.attend[stage - 1](ctx["keys"][stage - 1], ctx["values"][stage - 1], query)

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        s = self.n_stages
        h, c = state[:s], state[s:]
        word = lambda i: ts.embedding(self.embed, words[:, i])  # noqa: E731  (each stage its own previous word)
        if "mean_gates" in ctx:  # [y^0_{t-1}; h^{Nf}_{t-1}], f(V)'s share of the gates added
            split = {"gates": ctx["mean_gates"], "columns": self.step_columns}
            coarse_in = torch.cat([word(0), h[-1]], dim=1)
        else:
            split, coarse_in = {}, torch.cat([word(0), ctx["mean"], h[-1]], dim=1)
        h0, c0 = ts.lstm_cell(self.coarse, coarse_in, (h[0], c[0]), **split)
        hs, cs = [h0], [c0]
        alphas = [h0.new_zeros(h0.shape[0], ctx["keys"][0].shape[1])]
        g: torch.Tensor | None = None
        for i in range(1, s):
            g, alpha = self.attend_stage(i, ctx, hs[-1], g)
            hi, ci = ts.lstm_cell(self.fine[i - 1], torch.cat([word(i), g, hs[-1]], dim=1), (h[i], c[i]))
            hs.append(hi)
            cs.append(ci)
            alphas.append(alpha)
        hidden = torch.stack(hs, dim=1)
        return StepCore(hidden, (*hs, *cs), torch.stack(alphas, dim=1), hidden)

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """Each stage's own output layer on ``out [..., S, H]``."""
        return torch.stack([layer(self.dropout(out[..., s, :])) for s, layer in enumerate(self.logits)], dim=-2)


@register_model("stackcap_star")
class StackCapStar(CoarseToFine):
    """Stack-Cap*: independent attention, each fine stage queried by ``h^{i-1}_t`` alone."""

    def attention_query(self, h_prev: torch.Tensor, g_prev: torch.Tensor | None) -> torch.Tensor:
        return h_prev


@register_model("stackcap")
class StackCap(CoarseToFine):
    """Stack-Cap: stacked attention, queried by ``hbar^{i-1}_t = h^{i-1}_t + g^{i-1}_t`` (eq. 8),
    ``g^{i-1}_t = sum_n alpha^{i-1,n}_t (W^{i-1}_{va} V_n + b^{i-1}_{va})`` being the previous
    stage's attended feature, already computed for its own LSTM input (so reused, not recomputed)."""

    def attention_query(self, h_prev: torch.Tensor, g_prev: torch.Tensor | None) -> torch.Tensor:
        return h_prev if g_prev is None else h_prev + g_prev  # alpha^0 = 0: hbar^0 = h^0
