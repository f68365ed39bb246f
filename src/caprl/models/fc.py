"""Show-Tell (Vinyals et al. 2015): the image is the LSTM's first input, then the words."""

from __future__ import annotations

import torch
from torch import nn

from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, RowDropout, StepCore, register_model


@register_model("fc")
class ShowTell(CaptionModel):
    reads_regions = False  # encode reads the pooled vector alone

    def __init__(self, config, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.img_embed = nn.Linear(feat_dim, c.embed_size)
        self.lstm = nn.LSTMCell(c.embed_size, c.hidden_size)
        self.dropout = RowDropout(c.dropout)
        self.logit = nn.Linear(c.hidden_size, vocab_size)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        return {"img": self.img_embed(pooled)}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        img = ctx["img"]
        zeros = img.new_zeros(img.shape[0], self.config.hidden_size)
        h, c = self.lstm(img, (zeros, zeros))  # step t=-1 reads the image
        return (h, c)

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        h, c = ts.lstm_cell(self.lstm, ts.embedding(self.embed, words[:, 0]), state)
        return StepCore(h.unsqueeze(1), (h, c), None, h.unsqueeze(1))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, self.dropout(out))
