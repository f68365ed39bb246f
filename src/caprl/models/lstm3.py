"""LSTM3 layers (Stack-Cap paper's baseline): Show-Tell with three stacked LSTMs.

The image embedding is the first input of the bottom LSTM (step t=-1, as in ``fc``), the
words follow; each upper LSTM reads the hidden state of the one below. Only the top LSTM
has an output layer and is supervised (no intermediate supervision, ``n_stages = 1``).
Dropout is applied between the layers and before the output layer.
"""

from __future__ import annotations

import torch
from torch import nn

from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, StepCore, register_model

N_LAYERS = 3


@register_model("lstm3")
class LSTM3(CaptionModel):
    reads_regions = False  # encode reads the pooled vector alone

    def __init__(self, config: ModelConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.img_embed = nn.Linear(feat_dim, c.embed_size)
        sizes = [c.embed_size] + [c.hidden_size] * (N_LAYERS - 1)
        self.lstms = nn.ModuleList(nn.LSTMCell(n_in, c.hidden_size) for n_in in sizes)
        self.dropout = RowDropout(c.dropout)
        self.logit = nn.Linear(c.hidden_size, vocab_size)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        return {"img": self.img_embed(pooled)}

    def _layers(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """One step of the stack; ``state`` is (h1, c1, h2, c2, h3, c3)."""
        out: list[torch.Tensor] = []
        for layer, lstm in enumerate(self.lstms):
            h, c = ts.lstm_cell(lstm, x, (state[2 * layer], state[2 * layer + 1]))
            out += [h, c]
            x = self.dropout(h)
        return tuple(out)

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        img = ctx["img"]
        zeros = img.new_zeros(img.shape[0], self.config.hidden_size)
        return self._layers(img, (zeros,) * (2 * N_LAYERS))  # step t=-1 reads the image

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        state = self._layers(ts.embedding(self.embed, words[:, 0]), state)
        return StepCore(state[-2].unsqueeze(1), state, None, state[-2].unsqueeze(1))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, self.dropout(out))
