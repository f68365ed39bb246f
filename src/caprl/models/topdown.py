"""Top-Down attention (Anderson et al. 2018): an attention LSTM and a language LSTM."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from caprl.models.attention import AdditiveAttention
from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, StepCore, register_model, shared


@dataclass
class AttentionConfig(ModelConfig):
    att_hidden_size: int = 512


@register_model("topdown")
class TopDown(CaptionModel):
    config_class = AttentionConfig

    def __init__(self, config: AttentionConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.feat_embed = nn.Sequential(nn.Linear(feat_dim, c.hidden_size), nn.ReLU())
        self.att_lstm = nn.LSTMCell(c.hidden_size * 2 + c.embed_size, c.hidden_size)
        self.lang_lstm = nn.LSTMCell(c.hidden_size * 2, c.hidden_size)
        self.attention = AdditiveAttention(c.hidden_size, c.hidden_size, c.att_hidden_size)
        self.dropout = RowDropout(c.dropout)
        self.logit = nn.Linear(c.hidden_size, vocab_size)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        feats = self.feat_embed(regions)
        mean = feats.mean(dim=1)
        # the attention LSTM reads [h_lang, mean, word]: the mean's share of its gates is the
        # same at every step, so it is projected once here
        h = self.config.hidden_size
        return {"feats": shared(feats), "proj": shared(self.attention.precompute(feats)), "mean": mean,
                "mean_gates": F.linear(mean, self.att_lstm.weight_ih[:, h : 2 * h])}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        zeros = ctx["mean"].new_zeros(ctx["mean"].shape[0], self.config.hidden_size)
        return (zeros, zeros, zeros, zeros)

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        h_att, c_att, h_lang, c_lang = state
        h = self.config.hidden_size
        x = torch.cat([h_lang, ts.embedding(self.embed, words[:, 0])], dim=1)
        h_att, c_att = ts.lstm_cell(self.att_lstm, x, (h_att, c_att), gates=ctx["mean_gates"],
                                    columns=(slice(0, h), slice(2 * h, None)))
        attended, alpha = self.attention(ctx["feats"], ctx["proj"], h_att)
        h_lang, c_lang = ts.lstm_cell(self.lang_lstm, torch.cat([attended, h_att], dim=1), (h_lang, c_lang))
        return StepCore(h_lang.unsqueeze(1), (h_att, c_att, h_lang, c_lang), alpha.unsqueeze(1),
                        h_lang.unsqueeze(1))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, self.dropout(out))
