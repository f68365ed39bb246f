"""Soft attention (Xu et al. 2015, "Show, Attend and Tell"), the Stack-Cap paper's LSTM+Att_Soft.

At step t the attention reads the previous hidden state: ``alpha_t = softmax(w^T tanh(W_a a
+ W_h h_{t-1}))`` over the region features ``a`` (Xu's annotation vectors), the context is
``z_t = sum_n alpha_t,n a_n``, and the LSTM input is ``[E y_{t-1}; z_t]``. As in Xu et al.:
the initial ``h_0, c_0`` are MLPs (one tanh layer) of the mean region feature, and the
output is the deep output layer ``p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))``.
Xu's doubly stochastic attention penalty is a training term, not part of the model, and is
not used here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from caprl.models.attention import AdditiveAttention
from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, StepCore, register_model, shared


@dataclass
class SoftAttConfig(ModelConfig):
    att_hidden_size: int = 512


@register_model("softatt")
class SoftAttention(CaptionModel):
    config_class = SoftAttConfig

    def __init__(self, config: SoftAttConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.init_h = nn.Linear(feat_dim, c.hidden_size)
        self.init_c = nn.Linear(feat_dim, c.hidden_size)
        self.attention = AdditiveAttention(feat_dim, c.hidden_size, c.att_hidden_size)
        self.lstm = nn.LSTMCell(c.embed_size + feat_dim, c.hidden_size)
        self.out_h = nn.Linear(c.hidden_size, c.embed_size)  # L_h
        self.out_z = nn.Linear(feat_dim, c.embed_size, bias=False)  # L_z
        self.dropout = RowDropout(c.dropout)
        self.logit = nn.Linear(c.embed_size, vocab_size)  # L_o

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        return {"feats": shared(regions), "proj": shared(self.attention.precompute(regions)),
                "mean": regions.mean(dim=1)}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        return (torch.tanh(self.init_h(ctx["mean"])), torch.tanh(self.init_c(ctx["mean"])))

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        h, c = state
        z, alpha = self.attention(ctx["feats"], ctx["proj"], h)  # attention from h_{t-1}
        emb = ts.embedding(self.embed, words[:, 0])
        h, c = ts.lstm_cell(self.lstm, torch.cat([self.dropout(emb), z], dim=1), (h, c))
        deep = emb + ts.linear(self.out_h, self.dropout(h)) + ts.linear(self.out_z, z, bias=None)
        return StepCore(deep.unsqueeze(1), (h, c), alpha.unsqueeze(1), h.unsqueeze(1))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, self.dropout(out))  # the deep output layer L_o
