"""CLIP (Radford et al. 2021) through transformers' ``CLIPModel``: loading, and images and captions
embedded as CLIPScore embeds them.

Hessel et al. 2021 (CLIPScore, sec. 3; jmhessel/clipscore ``clipscore.py``) use ViT-B/32
(:data:`DEFAULT_MODEL` on the Hugging Face hub), CLIP's own image preprocessing (bicubic resize of
the short side to 224, centre crop, CLIP's mean and std: what the model's ``CLIPImageProcessor``
does) and prefix every caption with "A photo depicts" (``CLIPCapDataset(prefix='A photo
depicts')``, truncated to CLIP's 77 tokens). Cho et al. 2022's CLIP reward
(j-min/CLIP-Caption-Reward ``captioning/utils/clipscore.py``) loads the same checkpoint with
transformers and embeds the same way (``text_extract``: ``" ".join([prompt, text])``; the projected,
L2-normalised pooled outputs). openai's ``clip.load`` runs in float16 on a GPU; we embed in float32.

The weights are downloaded once by transformers and cached on the user's machine (``$HF_HOME``);
no test downloads them (tests build tiny random ``CLIPConfig`` models and pass them in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from caprl.errors import CaprlError

DEFAULT_MODEL = "openai/clip-vit-base-patch32"  # Hessel et al. 2021: ViT-B/32
PROMPT = "A photo depicts"  # Hessel et al.'s (and Cho et al.'s) caption prefix


class ClipUnavailable(CaprlError):
    """CLIP cannot be loaded here (no transformers, or no weights and no network): the metric or
    reward that needs it says why instead of running."""


def load_clip(name: str, device: torch.device | str | None = None) -> tuple[Any, Any, Any]:
    """``(CLIPModel in eval mode on device, tokenizer, image processor)`` of checkpoint ``name``
    (a Hugging Face hub name or a local folder), downloaded and cached by transformers on first use."""
    try:
        from transformers import CLIPModel, CLIPProcessor
    except ImportError as exc:
        raise ClipUnavailable(f"CLIP needs the transformers package ({exc}): pip install transformers") from None
    try:
        model = CLIPModel.from_pretrained(name)
        processor = CLIPProcessor.from_pretrained(name)
    except OSError as exc:
        raise ClipUnavailable(f"cannot load CLIP '{name}' ({exc}); run once with internet access (transformers caches "
                              "the weights under $HF_HOME) or copy the Hugging Face cache to this machine") from None
    device = torch.device(device) if device is not None else torch.device("cpu")
    return model.to(device).eval(), processor.tokenizer, processor.image_processor


def projected(output: Any) -> torch.Tensor:
    """The projected embeddings of ``get_text_features`` / ``get_image_features``: a tensor in
    transformers 4, the ``pooler_output`` of the returned output in transformers 5."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def open_image(path: Path, image_id: int) -> Image.Image:
    """One image as RGB; a missing or unreadable file is a CaprlError naming it."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise CaprlError(f"{path}: image not found (image id {image_id}); CLIP-S reads the raw images under the "
                         "dataset's media_root: restore them, or set the dataset's clip_score embedding to "
                         "listener or none") from None
    except (OSError, ValueError) as exc:
        raise CaprlError(f"{path}: cannot read image (image id {image_id}): {exc}") from exc


class ClipEmbedding:
    """Images (files by id) and captions embedded by a CLIP model (module docstring), on its device."""

    name = "clip"

    def __init__(self, model: Any, tokenizer: Any, image_processor: Any, image_paths: Mapping[int, Path],
                 prompt: str = PROMPT) -> None:
        self.model, self.tokenizer, self.image_processor = model.eval(), tokenizer, image_processor
        self.image_paths = image_paths
        self.prompt = prompt
        self.device = next(model.parameters()).device

    def text_of(self, caption: Sequence[str]) -> str:
        """The text CLIP reads: the prompt, a space, the caption (clipscore.py's prefix + caption)."""
        return " ".join([self.prompt, *caption]) if self.prompt else " ".join(caption)

    @torch.no_grad()
    def embed_images(self, image_ids: Sequence[int]) -> torch.Tensor:
        missing = [int(i) for i in image_ids if int(i) not in self.image_paths]
        if missing:
            raise CaprlError(f"CLIP: image id {missing[0]} has no file in the annotations")
        images = [open_image(self.image_paths[int(i)], int(i)) for i in image_ids]
        pixels = self.image_processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
        return F.normalize(projected(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)

    @torch.no_grad()
    def embed_texts(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        tokens = self.tokenizer([self.text_of(c) for c in captions], padding=True, truncation=True,
                                return_tensors="pt")
        out = self.model.get_text_features(input_ids=tokens["input_ids"].to(self.device),
                                           attention_mask=tokens["attention_mask"].to(self.device))
        return F.normalize(projected(out).float(), dim=-1)


def image_paths(annotations: Mapping[str, Any], media_root: str | Path) -> dict[int, Path]:
    """Image id -> its file under ``media_root`` (the annotations' ``file``, relative to it)."""
    root = Path(media_root)
    return {int(image["id"]): root / str(image["file"]) for image in annotations["images"]}
