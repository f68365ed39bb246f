"""Show-Tell (Vinyals et al. 2015) and its variants: an LSTM decoder on the pooled image vector.

``cell`` picks the recurrence. ``maxout`` is the FC model of Rennie et al. 2017 (sec. 3.1: the
cell's input through "a maxout non-linearity with 2 units"), the model every SCST comparison is
made on, and self-critical.pytorch's ``LSTMCore`` (captioning/models/FCModel.py, behind its
``newfc``; Luo et al.'s speaker, paper 004, is that code): five pre-activation chunks, the input
transform the larger of two linear maps (no tanh). ``lstm`` is Vinyals et al.'s LSTM (a tanh input
transform): the cell of gujiuxiang/Stack-Captioning's ``models/ShowTellModel.py`` (paper 000's
"LSTM" baseline, ``nn.LSTM`` with ``rnn_type`` lstm), of self-critical.pytorch's
``captioning/models/ShowTellModel.py`` (its ``show_tell``) and of marshimarocj/tf_expr_framework's
``impl/cell.py`` ``LSTMCell`` (paper 002's decoder). On the demo's data the recurrence is what
separated caprl's Show-Tell from SCP's trainer: XE best val CIDEr-D 155-161 (lstm) vs 174 (maxout),
SCST 204-220 vs 238 (benchmarks/README.md, "SCST against self-critical.pytorch's trainer").

``image`` says where the image goes. ``input`` (Vinyals et al.; both ShowTellModels above): its
embedding is the LSTM's first input, from a zero state, then the start token and the words.
``state`` (paper 002, Chen & Jin sec. 4.3: "We add one full connection layer after the encoder to
reduce the dimension to 512. In step 0, the hidden state is initialized by the output of this full
connection layer"): a linear map of the image to ``hidden_size`` is the initial state, h_0 = c_0
(marshimarocj/caption_competition ``decoder/rnn.py`` ``Decoder._ft_step`` sets every part of the
cell's state to it; tf_expr_framework ``impl/encoder/pca.py`` ``Encoder``: ``xw_plus_b``, no
non-linearity), and the first input is the start token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from caprl.errors import CaprlError
from caprl.models import timeshared as ts
from caprl.models.base import Batch, CaptionModel, ModelConfig, RowDropout, StepCore, register_model

CELLS = ("lstm", "maxout")
IMAGE = ("input", "state")  # the image: the LSTM's first input | its initial state (h_0 = c_0)


@dataclass
class ShowTellConfig(ModelConfig):
    cell: str = "maxout"  # maxout: Rennie et al.'s FC model, SCP's LSTMCore; lstm: Vinyals et al.'s
    image: str = "input"  # input: the LSTM's first input (Vinyals et al.); state: h_0 = c_0 (paper 002)


class MaxoutLSTMCell(nn.Module):
    """An LSTM step whose input transform is ``max(W_a [x, h], W_b [x, h])`` (SCP's LSTMCore):
    gates i, f, o = sigmoid of three chunks, c' = f c + i max(a, b), h' = o tanh(c')."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size, 5 * hidden_size)
        self.h2h = nn.Linear(hidden_size, 5 * hidden_size)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = state
        pre = ts.linear(self.i2h, x) + ts.linear(self.h2h, h)
        i, f, o, a, b = pre.chunk(5, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.maximum(a, b)
        return torch.sigmoid(o) * torch.tanh(c), c


@register_model("fc")
class ShowTell(CaptionModel):
    reads_regions = False  # encode reads the pooled vector alone
    config_class = ShowTellConfig

    def __init__(self, config: ShowTellConfig, vocab_size: int, feat_dim: int, n_regions: int) -> None:
        super().__init__(config, vocab_size, feat_dim, n_regions)
        c = config
        if c.cell not in CELLS:
            raise CaprlError(f"models: cell {c.cell!r} is not one of {', '.join(CELLS)}")
        if c.image not in IMAGE:
            raise CaprlError(f"models: image {c.image!r} is not one of {', '.join(IMAGE)}")
        self.embed = nn.Embedding(vocab_size, c.embed_size)
        self.img_embed = nn.Linear(feat_dim, c.embed_size if c.image == "input" else c.hidden_size)
        self.lstm: nn.Module = (nn.LSTMCell(c.embed_size, c.hidden_size) if c.cell == "lstm"
                                else MaxoutLSTMCell(c.embed_size, c.hidden_size))
        self.dropout = RowDropout(c.dropout)
        self.logit = nn.Linear(c.hidden_size, vocab_size)

    def encode(self, pooled: torch.Tensor, regions: torch.Tensor) -> Batch:
        return {"img": self.img_embed(pooled)}

    def init_state(self, ctx: Batch) -> tuple[torch.Tensor, ...]:
        img = ctx["img"]
        if self.config.image == "state":  # h_0 = c_0 = the image's linear map (caption_competition's _ft_step)
            return (img, img)
        zeros = img.new_zeros(img.shape[0], self.config.hidden_size)
        h, c = self.lstm(img, (zeros, zeros))  # step t=-1 reads the image
        return (h, c)

    def core(self, words: torch.Tensor, ctx: Batch, state: tuple[torch.Tensor, ...]) -> StepCore:
        h, c = ts.lstm_cell(self.lstm, ts.embedding(self.embed, words[:, 0]), state)
        return StepCore(h.unsqueeze(1), (h, c), None, h.unsqueeze(1))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        return ts.linear(self.logit, self.dropout(out))
