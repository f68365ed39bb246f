"""Recall@K and ranks of image retrieval (paper 004, sec. 6.2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

RECALL_KS = (1, 5, 10)


def ranks_of(sim: torch.Tensor | np.ndarray, target: torch.Tensor | np.ndarray | None = None) -> np.ndarray:
    """1-based rank of each caption's own image among all images (``sim [N, B]``; ``target``:
    its column, default the diagonal). Ties count against the caption: rank = 1 + the number
    of images scoring at least as high, other than its own."""
    s = torch.as_tensor(sim, dtype=torch.float64)
    t = torch.arange(s.shape[0], device=s.device) if target is None else \
        torch.as_tensor(target, dtype=torch.long, device=s.device)
    own = s.gather(1, t.view(-1, 1))
    beaten = (s >= own).sum(dim=1) - 1  # the own image always ties with itself
    return (beaten + 1).cpu().numpy()


def recall_report(ranks: np.ndarray, ks: tuple[int, ...] = RECALL_KS) -> dict[str, Any]:
    """``{"R@1": %, "R@5": %, "R@10": %, "mean_rank", "median_rank", "n_images"}`` (recall in 0..1)."""
    ranks = np.asarray(ranks)
    if ranks.size == 0:
        raise ValueError("no ranks to report")
    out: dict[str, Any] = {f"R@{k}": float((ranks <= k).mean()) for k in ks}
    out.update(mean_rank=float(ranks.mean()), median_rank=float(np.median(ranks)), n_images=int(ranks.size))
    return out
