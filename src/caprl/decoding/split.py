"""The one "decode a split in batches" loop (validation, evaluation, figures, captions)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch
from tqdm import tqdm

from caprl.data.prefetch import Prefetcher
from caprl.models.base import Batch, CaptionModel


def decode_split(
    model: CaptionModel,
    features_of: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    image_ids: Sequence[int],
    decode: Callable[[CaptionModel, Batch], Any],
    batch_size: int,
    desc: str = "decode",
    pass_pooled: bool = False,
) -> Iterator[tuple[list[int], Any]]:
    """Decode ``image_ids`` in batches on the model's device (eval mode, no gradient).

    ``decode(model, ctx)`` returns anything; yields ``(ids, result)`` per batch. With
    ``pass_pooled`` it is called ``decode(model, ctx, pooled=...)`` with the batch's pooled
    features on the device (decoders that read more than the model, e.g. lookahead's value
    network; the others take ``**_``). The next batch's features are read by a background
    thread while this one decodes; for a model that reads no regions, without them
    (``features_of(ids, regions=False)``).
    """
    model.eval()
    device = next(model.parameters()).device
    chunks = [list(image_ids[i : i + batch_size]) for i in range(0, len(image_ids), batch_size)]
    read = features_of if model.reads_regions else (lambda ids: features_of(ids, regions=False))
    with torch.no_grad(), Prefetcher(read, chunks, depth=1) as loaded:
        for ids, (pooled, regions) in tqdm(loaded, total=len(chunks), desc=desc, leave=False, mininterval=2.0,
                                           disable=None):
            pooled = pooled.to(device)
            ctx = model.encode(pooled, regions.to(device))
            yield ids, (decode(model, ctx, pooled=pooled) if pass_pooled else decode(model, ctx))

