"""What every backbone shares: the :class:`Backbone` interface, the ``name -> class`` registry
(:data:`BACKBONES`, :func:`register`, :func:`build_backbone`) and the image helpers. The backbones
themselves are in :mod:`caprl.features.backbones` (tinycnn, patches, the ResNets) and
:mod:`caprl.features.clip_grid` (clip); importing :mod:`caprl.features.backbones` registers them all.
"""

from __future__ import annotations

import abc
import json
from typing import Any, Callable, ClassVar, Mapping, TypeVar

import numpy as np
import torch
from PIL import Image

from caprl.registry import Registry

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Backbone(abc.ABC):
    """Common interface of all backbones (see the module docstring)."""

    name: ClassVar[str] = ""
    grid: int
    dim: int
    n_regions: int

    @classmethod
    @abc.abstractmethod
    def from_params(cls, features: Mapping[str, Any]) -> "Backbone":
        """Build from the ``features`` section of params.yaml."""

    @abc.abstractmethod
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """One PIL image (any mode) -> a float32 tensor ``[3, S, S]`` ready to batch."""

    @abc.abstractmethod
    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A preprocessed batch -> ``(pooled [B, D], regions [B, R, D])``, float32 on CPU."""

    def config(self) -> dict[str, Any]:
        """Settings that change the features (stored in the HDF5 attrs, checked on merge)."""
        return {}

    def attrs(self) -> dict[str, Any]:
        """The HDF5 attributes describing these features."""
        return {
            "backbone": self.name,
            "grid": self.grid,
            "dim": self.dim,
            "n_regions": self.n_regions,
            "backbone_config": json.dumps(self.config(), sort_keys=True),
        }


_BackboneT = TypeVar("_BackboneT", bound=type[Backbone])
BACKBONES: Registry[type[Backbone]] = Registry("backbone")


def register(name: str) -> Callable[[_BackboneT], _BackboneT]:
    """Class decorator: make a backbone available under ``name``."""
    return BACKBONES.register_class(name)


def build_backbone(features: Mapping[str, Any]) -> Backbone:
    """The backbone named by ``features.backbone``, built from its params section."""
    name = features["backbone"]
    return BACKBONES.get(name, where="backbone").from_params(features)


def _to_tensor(image: Image.Image, size: int, resample: Image.Resampling) -> torch.Tensor:
    """RGB, resized to ``size`` x ``size``, as float32 ``[3, size, size]`` in [0, 1]."""
    rgb = image.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), resample)
    array = np.asarray(rgb, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
