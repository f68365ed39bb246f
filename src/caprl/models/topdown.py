"""Top-Down attention (Anderson et al. 2018): an attention LSTM and a language LSTM."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from caprl.models.attention import AdditiveAttention
from caprl.models.base import Batch, CaptionModel, ModelConfig, StepOutput, register_model


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
        self.dropout = nn.Dropout(c.dropout)
        self.logit = nn.Linear(c.hidden_size, vocab_size)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        feats = self.feat_embed(regions)
        return {"feats": feats, "proj": self.attention.precompute(feats), "mean": feats.mean(dim=1)}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        zeros = ctx["mean"].new_zeros(ctx["mean"].shape[0], self.config.hidden_size)
        return (zeros, zeros, zeros, zeros)

    def step(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepOutput:
        h_att, c_att, h_lang, c_lang = state
        x = torch.cat([h_lang, ctx["mean"], self.embed(words[:, 0])], dim=1)
        h_att, c_att = self.att_lstm(x, (h_att, c_att))
        attended, alpha = self.attention(ctx["feats"], ctx["proj"], h_att)
        h_lang, c_lang = self.lang_lstm(torch.cat([attended, h_att], dim=1), (h_lang, c_lang))
        logprobs = torch.log_softmax(self.logit(self.dropout(h_lang)), dim=-1)
        return StepOutput(logprobs.unsqueeze(1), (h_att, c_att, h_lang, c_lang), alpha.unsqueeze(1),
                          h_lang.unsqueeze(1))
