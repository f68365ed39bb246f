"""Captioning models, by name: importing this package registers every architecture."""

from caprl.models import fc, lstm3, softatt, stackcap, topdown, transformer  # noqa: F401  (registration side effect)
from caprl.models.base import MODELS, CaptionModel, StepOutput, build_model, map_batch, register_model

__all__ = ["MODELS", "CaptionModel", "StepOutput", "build_model", "map_batch", "register_model"]
