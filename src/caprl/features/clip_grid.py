"""The ``clip`` backbone: a CLIP ViT image encoder's patch grid (transformers' ``CLIPVisionModel``).

What is read (one forward pass, ``last_hidden_state`` ``[B, 1 + grid**2, D]`` of the last
transformer block)::

    regions = last_hidden_state[:, 1:]    # the grid x grid patch tokens, row-major   [B, R, D]
    pooled  = last_hidden_state[:, 0]     # the CLS token                             [B, D]

Both are taken *before* CLIP's ``post_layernorm`` (``ln_post``) and projection, like the CLIP
captioning features of Shen et al. 2021, "How Much Can CLIP Benefit Vision-and-Language Tasks?"
(clip-vil/CLIP-ViL, ``CLIP-ViL-Direct/caption/scripts/clip_prepro_feats.py``: after the last
``resblock``, ``fc = x[0, 0, :]``, ``att = x[0, 1:, :]``, no ``ln_post``) and those of Cho et
al. 2022's CLIP-reward captioner (j-min/CLIP-Caption-Reward, the same script). ``pooled`` and
the regions so live in one space, as the file layout requires (one ``D`` for both,
:func:`caprl.data.feature_store.open_writer`); transformers' ``pooler_output`` is
``post_layernorm(pooled)``. ClipCap (Mokady et al. 2021) instead feeds the projected image
embedding (``ln_post`` + ``proj``, 512-d for ViT-B): one vector, no grid, of another size, so
it is not the ``pooled`` here.

``D`` is the encoder's width (768 for ViT-B, 1024 for ViT-L); ``grid = image_size // patch``
(7 for ViT-B/32 at 224 pixels, 14 for ViT-B/16). ``image_size`` other than the model's own
(e.g. 448 for a 14 x 14 grid from ViT-B/32, as CLIP-ViL's script does) interpolates the
position embeddings (transformers' ``interpolate_pos_encoding``: bicubic; CLIP-ViL resized
them with timm's ``resize_pos_embed``).

Preprocessing is CLIP's own (openai/CLIP ``clip.py`` ``_transform``; transformers'
``CLIPImageProcessor`` differs only in flooring the crop offsets): RGB; resize (bicubic) so the short side is ``image_size``, the long side
``int(image_size * long / short)``; center crop ``image_size`` square (offsets
``round((H - S) / 2)``, ``round((W - S) / 2)``, as torchvision's ``CenterCrop``); scale to
[0, 1]; normalise with :data:`CLIP_MEAN` / :data:`CLIP_STD`.

Settings (params.yaml ``features.clip``): ``model`` (a key of :data:`CLIP_MODELS`),
``image_size``, ``pretrained`` (false: the same architecture with random weights, built from a
local config without any download; tests only). The features file's ``backbone_config``
names the model.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from PIL import Image

from caprl.errors import CaprlError
from caprl.features.base import Backbone, _normalise, default_device, register

# openai/CLIP clip.py _transform (and every openai/clip-vit-* preprocessor_config.json)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# The architectures of the openai checkpoints on the Hugging Face hub (their config.json's
# vision_config), so that ``pretrained: false`` builds them locally and the plan knows the grid.
CLIP_MODELS: dict[str, dict[str, Any]] = {
    "openai/clip-vit-base-patch32": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                     "num_attention_heads": 12, "patch_size": 32, "image_size": 224},
    "openai/clip-vit-base-patch16": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                     "num_attention_heads": 12, "patch_size": 16, "image_size": 224},
    "openai/clip-vit-large-patch14": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                      "num_attention_heads": 16, "patch_size": 14, "image_size": 224},
    "openai/clip-vit-large-patch14-336": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                          "num_attention_heads": 16, "patch_size": 14, "image_size": 336},
}


def _known(model: str) -> dict[str, Any]:
    if model not in CLIP_MODELS:
        raise CaprlError(f"params.yaml features.clip.model: unknown CLIP model '{model}'; known: "
                         f"{', '.join(CLIP_MODELS)}")
    return CLIP_MODELS[model]


def clip_config(model: str) -> Any:
    """The ``transformers.CLIPVisionConfig`` of a known CLIP model, built locally (no download)."""
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(**_known(model), hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=512)


def _grid(image_size: int, patch_size: int) -> int:
    if image_size % patch_size:
        raise CaprlError(f"params.yaml features.clip.image_size: {image_size} is not a multiple of the model's "
                         f"patch size {patch_size}")
    return image_size // patch_size


def clip_grid(settings: Mapping[str, Any]) -> int:
    """The grid side of ``features.clip`` (``image_size / patch``), checked, without building the model."""
    return _grid(int(settings["image_size"]), int(_known(settings["model"])["patch_size"]))


def load_clip(model: str, pretrained: bool) -> Any:
    """A ``transformers.CLIPVisionModel``: downloaded weights, or the same architecture at random."""
    from transformers import CLIPVisionModel

    if not pretrained:
        return CLIPVisionModel(clip_config(model))
    _known(model)
    try:
        return CLIPVisionModel.from_pretrained(model)
    except OSError as exc:
        raise CaprlError(
            f"cannot load the pretrained weights {model} ({exc}); run once with internet access "
            "(weights are cached under $HF_HOME) or copy the Hugging Face cache to this machine"
        ) from exc


def clip_preprocess(image: Image.Image, size: int) -> torch.Tensor:
    """CLIP's preprocessing (module docstring) of one image -> float32 ``[3, size, size]``."""
    rgb = image.convert("RGB")
    w, h = rgb.size
    short, long = min(w, h), max(w, h)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    if (new_w, new_h) != (w, h):
        rgb = rgb.resize((new_w, new_h), Image.Resampling.BICUBIC)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    rgb = rgb.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
    return _normalise(x.unsqueeze(0), CLIP_MEAN, CLIP_STD)[0]


@register("clip")
class CLIPBackbone(Backbone):
    """A CLIP ViT's last-block tokens: the patch grid as regions, the CLS token as pooled (module docstring)."""

    def __init__(self, model: Any, image_size: int, model_name: str = "", device: torch.device | str | None = None,
                 pretrained: bool = False) -> None:
        config = model.config
        self.image_size = int(image_size)
        self.patch_size = int(config.patch_size)
        self.grid = _grid(self.image_size, self.patch_size)
        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.to(self.device).eval()
        self.model_name = model_name
        self.pretrained = bool(pretrained)
        self.interpolate = self.image_size != int(config.image_size)
        self.dim = int(config.hidden_size)
        self.n_regions = self.grid * self.grid

    @classmethod
    def from_params(cls, features: Mapping[str, Any]) -> "CLIPBackbone":
        c = features["clip"]
        clip_grid(c)  # a wrong model name or image size fails before the model is built
        model = load_clip(c["model"], bool(c["pretrained"]))
        return cls(model, image_size=c["image_size"], model_name=c["model"], pretrained=bool(c["pretrained"]))

    def config(self) -> dict[str, Any]:
        return {"model": self.model_name, "pretrained": self.pretrained, "image_size": self.image_size,
                "patch_size": self.patch_size, "grid": self.grid,
                "read": "last_hidden_state before post_layernorm: regions = tokens 1.., pooled = CLS"}

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return clip_preprocess(image, self.image_size)

    @torch.no_grad()
    def tokens(self, batch: torch.Tensor) -> torch.Tensor:
        """The last block's tokens ``[B, 1 + R, D]`` (CLS first; on the model's device)."""
        out = self.model(pixel_values=batch.to(self.device, dtype=torch.float32),
                         interpolate_pos_encoding=self.interpolate)
        return out.last_hidden_state

    @torch.no_grad()
    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tokens(batch)
        return x[:, 0].float().contiguous().cpu(), x[:, 1:].float().contiguous().cpu()
