"""Backbones: ``name -> class`` turning PIL images into a pooled vector and a grid of regions.

Every backbone has the same interface::

    backbone = build_backbone(params["features"])     # or SomeBackbone.from_params(...)
    batch = torch.stack([backbone.preprocess(img) for img in images])
    pooled, regions = backbone(batch)                   # [B, D], [B, R, D], float32, CPU

with attributes ``name``, ``grid`` (regions form a grid x grid map), ``dim`` (D) and
``n_regions`` (R = grid * grid). Regions are in row-major order: region ``r`` is row
``r // grid`` (top to bottom), column ``r % grid`` (left to right).

Adding a backbone is one class decorated with ``@register("name")`` (:mod:`caprl.features.base`),
here or in a module imported at the end of this one (the plan checks ``datasets.<name>.backbone`` against the registry).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from PIL import Image

from caprl.errors import CaprlError
from caprl.features.base import (  # noqa: F401  (re-exported: the registry and interface users import from here)
    BACKBONES, IMAGENET_MEAN, IMAGENET_STD, Backbone, _normalise, _to_tensor, build_backbone, default_device, register,
)

log = logging.getLogger(__name__)

__all__ = ["BACKBONES", "Backbone", "build_backbone", "default_device", "register", "PatchesBackbone",
           "TinyCNNBackbone", "ResNetBackbone", "ResNet101Backbone", "ResNet152Backbone", "resnet_config"]

# ----------------------------------------------------------------------------- patches


@register("patches")
class PatchesBackbone(Backbone):
    """Cheap built-in backbone for the synthetic data: the image itself, on a coarse grid.

    The image is resized (box filter) to ``OVERSAMPLE * grid * cell_size`` pixels square,
    then average-pooled by ``OVERSAMPLE`` to ``grid * cell_size`` square, so each of the
    grid x grid cells becomes a ``cell_size`` x ``cell_size`` patch of channels. Channels are
    RGB mapped from [0, 1] to [-1, 1] (``2 * v - 1``: zero for mid-grey, unit scale), followed by
    the optional ``extras`` (``features.patches.extras``; absent means none), each also pooled to
    ``cell_size`` x ``cell_size`` from the oversampled image:

    * ``saturation`` -- chroma ``max(R,G,B) - min(R,G,B)``, which separates coloured shapes
      from a grey/white background whatever their hue; normalised as ``(c - 0.2) / 0.3``;
    * ``edges`` -- gradient magnitude of the grey image (forward differences), so thin
      outlines that averaging blurs away still show; normalised as ``(e - 0.05) / 0.1``.

    A region is its cell's channels flattened channel-major: ``dim = n_channels * cell_size**2``
    (48 with the defaults grid 4, cell_size 4, no extras). ``pooled`` is the whole image
    as one such patch (a ``cell_size`` x ``cell_size`` thumbnail, same size as a region): the
    mean of raw pixel patches would keep only the average colour, and a global-feature model
    (Show-Tell) would see no layout at all.
    """

    OVERSAMPLE: ClassVar[int] = 4
    EXTRAS: ClassVar[dict[str, tuple[float, float]]] = {"saturation": (0.2, 0.3), "edges": (0.05, 0.1)}

    def __init__(self, grid: int = 4, cell_size: int = 4, extras: tuple[str, ...] | list[str] = ()) -> None:
        unknown = [e for e in extras if e not in self.EXTRAS]
        if unknown:
            raise CaprlError(
                f"params.yaml features.patches.extras: unknown extra(s) {unknown}; known: {', '.join(self.EXTRAS)}"
            )
        self.grid = int(grid)
        self.cell_size = int(cell_size)
        self.extras = tuple(extras)
        self.n_regions = self.grid * self.grid
        self.dim = (3 + len(self.extras)) * self.cell_size**2
        self.image_size = self.OVERSAMPLE * self.grid * self.cell_size

    @classmethod
    def from_params(cls, features: Mapping[str, Any]) -> "PatchesBackbone":
        p = features["patches"]
        return cls(grid=p["grid"], cell_size=p["cell_size"], extras=tuple(p.get("extras", ())))

    def config(self) -> dict[str, Any]:
        return {"grid": self.grid, "cell_size": self.cell_size, "extras": list(self.extras)}

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return _to_tensor(image, self.image_size, Image.Resampling.BOX)

    def _channels(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 3, S, S]`` in [0, 1] -> ``[B, C, grid*cell, grid*cell]`` normalised channels."""
        k = self.OVERSAMPLE
        chans = [2.0 * F.avg_pool2d(x, k) - 1.0]
        for extra in self.extras:
            if extra == "saturation":
                full = x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True)
            else:  # edges
                grey = x.mean(dim=1, keepdim=True)
                dx = F.pad(grey[..., :, 1:] - grey[..., :, :-1], (0, 1, 0, 0))
                dy = F.pad(grey[..., 1:, :] - grey[..., :-1, :], (0, 0, 0, 1))
                full = torch.sqrt(dx * dx + dy * dy)
            mean, std = self.EXTRAS[extra]
            chans.append((F.avg_pool2d(full, k) - mean) / std)
        return torch.cat(chans, dim=1)

    @torch.no_grad()
    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = batch.float()
        chans = self._channels(x)  # [B, C, G*c, G*c]
        b, c, g, s = chans.shape[0], chans.shape[1], self.grid, self.cell_size
        cells = chans.view(b, c, g, s, g, s).permute(0, 2, 4, 1, 3, 5)  # [B, G, G, C, s, s]
        regions = cells.reshape(b, g * g, c * s * s).contiguous()
        thumbnail = F.avg_pool2d(chans, g).reshape(b, c * s * s)
        return thumbnail, regions


# ----------------------------------------------------------------------------- tinycnn


@register("tinycnn")
class TinyCNNBackbone(Backbone):
    """The synthetic sets' backbone: a tiny CNN pre-trained on single shapes, frozen
    (:mod:`caprl.features.tinycnn`), read on a ``grid`` x ``grid`` layout.

    The 64-pixel image (smaller ones upsampled) gives a C-channel map (C = 64) of 16 x 16; each
    layout cell is its channels' maximum over the cell (``adaptive_max_pool2d``), so a cell says
    which shape, colour and size stands there. ``pooled`` is the layout itself, the cells'
    channels one after the other (``grid**2 * C`` numbers, 576 with grid 3): what the captions say
    (objects, attributes, positions) is in the one vector that Show-Tell and the listener read.
    Region ``r`` (cell ``r``, row-major) is the same ``grid**2 * C`` vector with only cell ``r``'s
    block filled: an attention model attends over the cells and knows where each one is, and the
    sum of the regions is ``pooled``. The synthetic captions place objects on a 3 x 3 layout,
    hence grid 3 (measured: ``python benchmarks/synthetic_features.py``).
    """

    def __init__(self, net: Any, grid: int = 3, weights: str = "builtin", record: dict[str, Any] | None = None) -> None:
        self.net = net
        self.grid = int(grid)
        self.weights = weights
        self.record = record or {}
        self.channels = int(net.channels)
        self.n_regions = self.grid * self.grid
        self.dim = self.n_regions * self.channels

    @classmethod
    def from_params(cls, features: Mapping[str, Any]) -> "TinyCNNBackbone":
        from caprl.features import tinycnn

        settings = features["tinycnn"]
        path = tinycnn.BUILTIN_WEIGHTS if settings["weights"] == "builtin" else settings["weights"]
        net, record = tinycnn.load(path)
        return cls(net, grid=settings["grid"], weights=str(settings["weights"]), record=record)

    def config(self) -> dict[str, Any]:
        return {"grid": self.grid, "weights": self.weights, "pretrain": self.record.get("config", {}),
                "code_version": self.record.get("code_version", "")}

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        from caprl.features.tinycnn import to_input

        return to_input(image)

    @torch.no_grad()
    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cells = F.adaptive_max_pool2d(self.net.feature_map(batch.float()), self.grid)  # [B, C, g, g]
        b, c, r = cells.shape[0], self.channels, self.n_regions
        cells = cells.flatten(2).transpose(1, 2)  # [B, R, C], row-major cells
        pooled = cells.reshape(b, r * c)
        regions = torch.zeros(b, r, r, c)
        regions[:, torch.arange(r), torch.arange(r)] = cells  # region r: only block r filled
        return pooled.contiguous(), regions.reshape(b, r, r * c)


# ----------------------------------------------------------------------------- ResNet

RESNET_MODEL_IDS = {"resnet101": "microsoft/resnet-101", "resnet152": "microsoft/resnet-152"}
RESNET_DEPTHS = {"resnet101": [3, 4, 23, 3], "resnet152": [3, 8, 36, 3]}


def resnet_config(name: str) -> Any:
    """The ``transformers.ResNetConfig`` of ``resnet101``/``resnet152``, built locally (no download)."""
    from transformers import ResNetConfig

    return ResNetConfig(
        num_channels=3,
        embedding_size=64,
        hidden_sizes=[256, 512, 1024, 2048],
        depths=RESNET_DEPTHS[name],
        layer_type="bottleneck",
        hidden_act="relu",
        downsample_in_first_stage=False,
    )


def load_resnet(name: str, pretrained: bool) -> Any:
    """A ``transformers.ResNetModel``: downloaded weights, or the same architecture at random."""
    from transformers import ResNetModel

    if not pretrained:
        return ResNetModel(resnet_config(name))
    model_id = RESNET_MODEL_IDS[name]
    try:
        return ResNetModel.from_pretrained(model_id)
    except OSError as exc:
        raise CaprlError(
            f"cannot load the pretrained weights {model_id} ({exc}); run once with internet access "
            "(weights are cached under $HF_HOME) or copy the Hugging Face cache to this machine"
        ) from exc


class ResNetBackbone(Backbone):
    """A ResNet's last conv map: grid regions by adaptive average pooling, plus its mean.

    The image is resized (bilinear) to ``image_size`` square and normalised with the
    ImageNet mean/std. The final stage's map ``[B, D, H, W]`` (14x14 for 448 pixels) gives
    ``pooled = map.mean((H, W))`` (the model's own global average pool) and
    ``regions = adaptive_avg_pool2d(map, grid)`` flattened row-major to ``[B, grid*grid, D]``.
    ``D`` is the last hidden size (2048 for ResNet-101/152).
    """

    def __init__(self, model: Any, image_size: int, grid: int, device: torch.device | str | None = None,
                 pretrained: bool = False) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.to(self.device).eval()
        self.image_size = int(image_size)
        self.grid = int(grid)
        self.pretrained = bool(pretrained)
        self.dim = int(model.config.hidden_sizes[-1])
        self.n_regions = self.grid * self.grid
        self._warned = False

    @classmethod
    def from_params(cls, features: Mapping[str, Any]) -> "ResNetBackbone":
        r = features["resnet"]
        model = load_resnet(cls.name, bool(r["pretrained"]))
        return cls(model, image_size=r["image_size"], grid=r["grid"], pretrained=bool(r["pretrained"]))

    def config(self) -> dict[str, Any]:
        return {"image_size": self.image_size, "grid": self.grid, "pretrained": self.pretrained,
                "model": RESNET_MODEL_IDS.get(self.name, "")}

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        x = _to_tensor(image, self.image_size, Image.Resampling.BILINEAR)
        return _normalise(x.unsqueeze(0), IMAGENET_MEAN, IMAGENET_STD)[0]

    @torch.no_grad()
    def feature_map(self, batch: torch.Tensor) -> torch.Tensor:
        """The final conv map ``[B, D, H, W]`` (on the model's device)."""
        out = self.model(pixel_values=batch.to(self.device, dtype=torch.float32))
        return out.last_hidden_state

    @torch.no_grad()
    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fmap = self.feature_map(batch)
        if not self._warned and min(fmap.shape[-2:]) < self.grid:
            log.warning("%s: conv map %s is smaller than the %dx%d grid; regions are interpolated "
                        "(raise features.resnet.image_size)", self.name, tuple(fmap.shape[-2:]), self.grid, self.grid)
            self._warned = True
        pooled = fmap.mean(dim=(2, 3))
        regions = F.adaptive_avg_pool2d(fmap, self.grid).flatten(2).transpose(1, 2)
        return pooled.float().cpu(), regions.float().contiguous().cpu()


@register("resnet101")
class ResNet101Backbone(ResNetBackbone):
    """ResNet-101 (``microsoft/resnet-101``)."""


@register("resnet152")
class ResNet152Backbone(ResNetBackbone):
    """ResNet-152 (``microsoft/resnet-152``)."""


from caprl.features import clip_grid  # noqa: E402,F401  (registers "clip")
