"""Eq. 4 of paper 004 (VSE++'s max-of-hinges): hardest negative caption and hardest negative image;
and VSE0's sum of hinges over every negative (the listener's pre-training warm-up)."""

from __future__ import annotations

import torch


def vse_hinge(sim: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-caption loss ``[N]`` of eq. 4.

    ``sim [N, B]``: cosine of caption n and image b; ``target [N]``: the image (column) each
    caption describes. For caption n of image i = target[n]:

        max(0, m - s(n, i) + max_{k: target[k] != i} s(k, i))     hardest negative caption
      + max(0, m - s(n, i) + max_{j != i} s(n, j))                hardest negative image

    Captions of the same image are not each other's negatives (several samples or gold
    captions per image). A term with no negative in the batch is 0.
    """
    n, b = sim.shape
    positive = sim.gather(1, target.view(-1, 1)).squeeze(1)  # [N]
    own = torch.nn.functional.one_hot(target, b).bool()  # [N, B]: caption n describes image b
    very_low = torch.finfo(sim.dtype).min
    hardest_image = sim.masked_fill(own, very_low).max(dim=1).values  # [N]
    # hardest negative caption of image b: the best score any other image's caption gets for b
    hardest_caption = sim.masked_fill(own, very_low).max(dim=0).values  # [B]
    neg_caption = hardest_caption.gather(0, target)
    has_image, has_caption = (~own).any(dim=1), (~own).any(dim=0).gather(0, target)
    loss_caption = torch.where(has_caption, (margin - positive + neg_caption).clamp(min=0), positive.new_zeros(()))
    loss_image = torch.where(has_image, (margin - positive + hardest_image).clamp(min=0), positive.new_zeros(()))
    return loss_caption + loss_image


def vse_sum_hinge(sim: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-caption loss ``[N]`` of VSE0 (Kiros et al.; VSE++'s "sum of hinges"): eq. 4 with
    every negative summed instead of the hardest one,

        sum_{k: target[k] != i} max(0, m - s(n, i) + s(k, i)) + sum_{j != i} max(0, m - s(n, i) + s(n, j)).

    From random weights the hardest negatives give nearly no signal (every caption and image
    embed alike and each term sits at the margin); summing over all negatives does, so the
    listener's pre-training starts with it (``warmup_epochs``)."""
    positive = sim.gather(1, target.view(-1, 1))  # [N, 1]
    own = torch.nn.functional.one_hot(target, sim.shape[1]).bool()  # [N, B]
    images = ((margin - positive + sim).clamp(min=0) * (~own)).sum(dim=1)
    column = sim[:, target].t()  # [N, N]: (n, k) = s(k, target[n]), caption k against n's image
    other = target.view(-1, 1) != target.view(1, -1)  # caption k describes another image
    captions = ((margin - positive + column).clamp(min=0) * other).sum(dim=1)
    return images + captions
