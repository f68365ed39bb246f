"""``caprl attention-figure``: every stage's greedy caption with its per-word attention maps.

Stack-Captioning Fig. 3: for a few images of the evaluation split (the first
``--n-images`` by id), one PNG each. Row s is stage s (coarse to fine; one row for a
one-stage attention model): the image under the stage's name, then one panel per word of
the stage's greedy caption, titled with the word and showing the weights that produced it. As in the paper, the
``grid x grid`` weights are upsampled to the image size (nearest), smoothed with a
Gaussian (``SIGMA_CELLS`` grid cells) and laid over the image (``ALPHA``); each map is
scaled by its own maximum, so a uniform map is uniformly bright. Stages without attention
(the coarse stage) show their words over the plain image.

All stages are decoded in one greedy pass, each stage reading its own previous word
(``caprl.decoding.sample``), as in the C2F objective's inference mode. Outputs:
``<out-dir>/attention_<k>.png`` for k = 0..n-1, each written atomically. Figures are drawn
on matplotlib's Agg canvas directly (no pyplot, no global backend state).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from caprl import decoding, params as params_mod
from caprl.models import checkpoint
from caprl.io import provenance
from caprl.errors import CaprlError
from caprl.features.extract import load_image
from caprl.io import atomic_path
from caprl.models import CaptionModel
from caprl.device import default_device
from caprl.data.loader import CaptionData, Loading, add_data_arguments

from caprl.evaluation.heatmap import ALPHA, CMAP, SIGMA_CELLS, attention_map  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

PANEL_INCHES = 1.4
STAGE_COLOURS = ["black", "purple", "red"]  # coarse, refined, final (as the paper's Fig. 3)


def stage_names(n_stages: int) -> list[str]:
    if n_stages == 1:
        return ["caption"]
    return ["coarse"] + [f"fine {i}" for i in range(1, n_stages)]


def stage_colour(stage: int, n_stages: int) -> str:
    """Coarse black, intermediate purple, final red."""
    return STAGE_COLOURS[2 if stage == n_stages - 1 else min(stage, 1)]


def attention_figure(image: np.ndarray, captions: Sequence[Sequence[str]], attention: np.ndarray | None,
                     grid: int, title: str = "") -> Figure:
    """The figure of one image: ``captions[s]`` words and ``attention [S, T, R]`` (None: no maps)."""
    height, width = image.shape[:2]
    n_stages = len(captions)
    cols = 1 + max(1, max(len(c) for c in captions))
    fig = Figure(figsize=(PANEL_INCHES * cols, PANEL_INCHES * n_stages + 0.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_stages, cols, squeeze=False)
    names = stage_names(n_stages)
    for s, words in enumerate(captions):
        colour = stage_colour(s, n_stages)
        axes[s, 0].imshow(image)
        axes[s, 0].set_title(names[s], fontsize=9, color=colour, fontweight="bold")
        has_maps = attention is not None and float(np.abs(attention[s]).sum()) > 0
        for t in range(cols - 1):
            ax = axes[s, t + 1]
            if t < len(words):
                ax.imshow(image)
                if has_maps:
                    heat = attention_map(attention[s, t], grid, height, width)
                    ax.imshow(heat, cmap=CMAP, alpha=ALPHA, vmin=0.0, vmax=1.0)
                ax.set_title(words[t], fontsize=9, color=colour)
            else:
                ax.axis("off")
        for ax in axes[s]:
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def stage_captions(model: CaptionModel, data: CaptionData, image_ids: list[int],
                   max_length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy ``tokens [N, S, T]`` of every stage and their ``attention [N, S, T, R]`` (or None), on the CPU."""
    ((_, out),) = decoding.decode_split(model, data.features_of, image_ids,  # a few images: one batch
                                        lambda m, ctx: decoding.sample(m, ctx, max_length, greedy=True),
                                        batch_size=len(image_ids), desc="attention")
    return out.tokens.cpu(), None if out.attention is None else out.attention.cpu()


def draw_attention_figures(model: CaptionModel, data: CaptionData, image_ids: list[int], image_root: Path,
                           max_length: int, out_dir: Path) -> list[Path]:
    """Write ``attention_<k>.png`` for ``image_ids[k]``; returns the paths."""
    grid = int(data.features.grid)
    if grid * grid != data.n_regions:
        raise CaprlError(f"{data.paths.features}: {data.n_regions} regions do not form a grid "
                         f"({grid}x{grid}); attention maps need grid features")
    tokens, attention = stage_captions(model, data, image_ids, max_length)
    if attention is None:
        raise CaprlError(f"model '{type(model).__name__}' has no attention: no attention maps to draw")
    records = {int(im["id"]): im for im in data.annotations["images"]}
    paths = []
    for k, image_id in enumerate(image_ids):
        record = records[image_id]
        image = np.asarray(load_image(image_root / record["file"], image_id, str(data.paths.annotations)))
        captions = data.decode(tokens[k])
        n_words = [len(c) for c in captions]
        maps = attention[k, :, : max(n_words)].numpy() if max(n_words) else None
        reference = record["raw"][0] if record["raw"] else ""
        fig = attention_figure(image, captions, maps, grid, title=f"image {image_id} — GT: {reference}")
        path = out_dir / f"attention_{k}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        paths.append(path)
        log.info("image %d: %s -> %s", image_id, " | ".join(" ".join(c) for c in captions), path)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--checkpoint", required=True, help="a trained attention model (e.g. the Stack-Cap C2F run)")
    add_data_arguments(parser)
    parser.add_argument("--image-root", required=True, help="folder the annotations' image paths are relative to")
    parser.add_argument("--out-dir", required=True, help="writes attention_<k>.png, k = 0..n-1, here")
    parser.add_argument("--n-images", type=int, default=3, help="images of the evaluation split to draw")


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    torch.set_num_threads(max(1, params["train"]["num_threads"]))
    data = CaptionData.from_args(args, Loading.from_params(params))
    ckpt = checkpoint.load(args.checkpoint, vocab_sha256=data.vocab.sha256)
    provenance.check_model_inputs(args.checkpoint, ckpt.made_from, args.features, data.features.attrs,
                                  args.annotations, data.annotations)
    model = checkpoint.model_from_checkpoint(ckpt).to(default_device())
    split = params["evaluate"]["split"]
    ids = sorted(data.split_ids(split))
    if args.n_images < 1 or args.n_images > len(ids):
        raise CaprlError(f"--n-images {args.n_images}: the {split} split has {len(ids)} images")
    paths = draw_attention_figures(model, data, ids[: args.n_images], Path(args.image_root),
                                   params["decode"]["max_length"], Path(args.out_dir))
    log.info("%d attention figures written to %s", len(paths), args.out_dir)
