"""The listener (paper 004, appendix A; Faghri et al.'s VSE++): images and captions in one space.

Image side: the pooled feature (ResNet's 2048-d vector on COCO) -> Linear -> L2 norm.
Caption side: each word -> ``word_size`` (a product with the embedding matrix, so a
caption may be token ids, one-hot rows or soft distributions over the vocabulary, and
gradients reach whatever produced the distributions) -> GRU(``hidden_size``); the
caption's embedding is the GRU output at its last word, L2-normalised. The score of a
(caption, image) pair is the cosine similarity. Paper sizes: word 512, GRU and joint
space 1024.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from caprl.errors import CaprlError


@dataclass(frozen=True)
class ListenerConfig:
    word_size: int  # word embedding (paper: 512)
    hidden_size: int  # GRU and joint embedding space (paper: 1024)
    margin: float  # hinge margin of eq. 4 (VSE++: 0.2)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "listener") -> "ListenerConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown, missing = sorted(set(values) - names), sorted(names - set(values))
        if unknown or missing:
            raise CaprlError(f"{where}: expected keys {', '.join(sorted(names))}"
                             + (f"; unknown {', '.join(unknown)}" if unknown else "")
                             + (f"; missing {', '.join(missing)}" if missing else ""))
        return cls(int(values["word_size"]), int(values["hidden_size"]), float(values["margin"]))


def caption_lengths(tokens: torch.Tensor) -> torch.Tensor:
    """Words before the end token (id 0) of each row of ``tokens [N, T]``."""
    ended = (tokens == 0).long().cumsum(dim=1) > 0
    return (~ended).sum(dim=1)


class Listener(nn.Module):
    """Scores (caption, image) pairs by the cosine of their embeddings."""

    def __init__(self, config: ListenerConfig, vocab_size: int, feat_dim: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size, self.feat_dim = vocab_size, feat_dim
        self.words = nn.Parameter(torch.empty(vocab_size, config.word_size))
        nn.init.uniform_(self.words, -0.1, 0.1)
        self.gru = nn.GRU(config.word_size, config.hidden_size, batch_first=True)
        self.image = nn.Linear(feat_dim, config.hidden_size)

    def embed_images(self, pooled: torch.Tensor) -> torch.Tensor:
        """``[B, D]`` pooled features -> ``[B, H]`` unit vectors."""
        return F.normalize(self.image(pooled), dim=-1)

    def embed_captions(self, words: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Captions -> ``[N, H]`` unit vectors.

        ``words``: token ids ``[N, T]`` (lengths taken from the end token), or rows over the
        vocabulary ``[N, T, V]`` (one-hot, straight-through or soft; ``lengths`` required:
        the number of words of each caption, its end token excluded). An empty caption is
        read as its first row.
        """
        if words.dtype in (torch.long, torch.int32, torch.int64):
            lengths = caption_lengths(words) if lengths is None else lengths
            vectors = F.embedding(words, self.words)
        else:
            if lengths is None:
                raise CaprlError("Listener.embed_captions: rows over the vocabulary need the caption lengths")
            if words.shape[-1] != self.vocab_size:
                raise CaprlError(f"Listener.embed_captions: rows of {words.shape[-1]} entries, vocabulary of "
                                 f"{self.vocab_size}")
            vectors = words @ self.words.to(words.dtype)
        out, _ = self.gru(vectors)  # [N, T, H]; causal, so what follows the last word does not matter
        last = (lengths.to(out.device).long() - 1).clamp(min=0)
        picked = out.gather(1, last.view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
        return F.normalize(picked, dim=-1)

    def similarity(self, captions: torch.Tensor, pooled: torch.Tensor,
                   lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, B]``: cosine of caption n and image b."""
        return self.embed_captions(captions, lengths) @ self.embed_images(pooled).t()
