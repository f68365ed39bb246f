"""How far RL moved a captioner from where it started: the KL of the trained policy to its start.

``caprl evaluate --start CKPT`` (the workflow passes the run's ``init.model`` checkpoint, the XE
run an RL run starts from) adds ``kl_to_start`` to the score file's ``failure_modes`` section: over
the evaluated captions (one per image), the mean of

    sum_t KL(pi(. | image, w_<t) || pi_start(. | image, w_<t))

over the caption's positions t (its words and the end token, or the step after the last word of a
caption cut at the maximum length), both models in eval mode, teacher-forced on the trained
model's own caption: the exact KL of the two next-word distributions at every step the caption
went through (nats per caption), not a sampled estimate. PPO-KL's penalty keeps this small;
SCST has none (Stiennon et al. 2020 report it the same way, on the policy's samples).
Multi-stage models: every stage reads the caption's words; the last stage's distributions count.
"""

from __future__ import annotations

from typing import Any

import torch

from caprl.data.loader import CaptionData
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel

START_RUN = "start_run"


def caption_kl(model: CaptionModel, start: CaptionModel, pooled: torch.Tensor, regions: torch.Tensor,
               tokens: torch.Tensor) -> torch.Tensor:
    """``[N]``: each caption's summed per-step KL(model || start); ``tokens [N, T]`` (0-padded)."""
    with torch.no_grad():
        lp = model.teacher_forcing(model.encode(pooled, regions), tokens)[:, -1]  # [N, T+1, V] log-probabilities
        lq = start.teacher_forcing(start.encode(pooled, regions), tokens)[:, -1]
        per_step = (lp.exp() * (lp - lq)).sum(-1)  # [N, T+1]
        lengths = (tokens > 0).sum(1, keepdim=True)
        live = torch.arange(tokens.shape[1] + 1, device=tokens.device).unsqueeze(0) <= lengths
        return (per_step * live).sum(1)


def kl_to_start(model: CaptionModel, start: CaptionModel, data: CaptionData, captions: dict[int, str],
                batch_size: int, where: str) -> float:
    """The mean over ``captions`` (image id -> words) of :func:`caption_kl`, on ``model``'s device."""
    if start.vocab_size != model.vocab_size:
        raise CaprlError(f"{where}: the start model has {start.vocab_size} words, the evaluated one "
                         f"{model.vocab_size}: pass the checkpoint of the run's init.model")
    model.eval()
    start.eval()
    device = next(model.parameters()).device
    ids, total = list(captions), 0.0
    for b in range(0, len(ids), batch_size):
        chunk = ids[b : b + batch_size]
        encoded = [data.vocab.encode(captions[i].split()) for i in chunk]
        tokens = torch.zeros(len(chunk), max(1, max(map(len, encoded))), dtype=torch.long)
        for row, words in enumerate(encoded):
            tokens[row, : len(words)] = torch.tensor(words, dtype=torch.long)
        pooled, regions = data.features_of(chunk, regions=model.reads_regions or start.reads_regions)
        total += float(caption_kl(model, start, pooled.to(device), regions.to(device), tokens.to(device)).sum())
    return total / max(1, len(ids))


def start_section(start_ckpt: Any, start_path: str) -> dict[str, Any]:
    """What the section records of the start: its run's name and path."""
    return {START_RUN: str(start_ckpt.run.get("name") or start_path)}
