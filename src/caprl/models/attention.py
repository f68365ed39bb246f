"""Additive (Bahdanau-style) spatial attention shared by the attention models."""

from __future__ import annotations

import torch
from torch import nn


class AdditiveAttention(nn.Module):
    """alpha = softmax(w^T tanh(W_v V + W_h h)); returns (sum_n alpha_n V_n, alpha)."""

    def __init__(self, feat_size: int, query_size: int, hidden_size: int) -> None:
        super().__init__()
        self.proj_feats = nn.Linear(feat_size, hidden_size)
        self.proj_query = nn.Linear(query_size, hidden_size)
        self.score = nn.Linear(hidden_size, 1)

    def precompute(self, feats: torch.Tensor) -> torch.Tensor:
        """W_v V once per image, not once per step."""
        return self.proj_feats(feats)

    def forward(
        self, feats: torch.Tensor, proj_feats: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.score(torch.tanh(proj_feats + self.proj_query(query).unsqueeze(1))).squeeze(-1)
        alpha = torch.softmax(scores, dim=-1)
        return torch.bmm(alpha.unsqueeze(1), feats).squeeze(1), alpha
