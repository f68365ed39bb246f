"""Image features: a registry of backbones, sharded extraction to HDF5, merging, a reader.

* :mod:`caprl.features.base` -- the :class:`Backbone` interface and the registry (``BACKBONES``, ``@register``).
* :mod:`caprl.features.backbones` -- ``name -> Backbone`` (``tinycnn``, ``patches``, ``resnet101``, ``resnet152``,
  ``clip``).
* :mod:`caprl.features.clip_grid` -- ``clip``: a CLIP ViT's patch grid (transformers' ``CLIPVisionModel``).
* :mod:`caprl.features.tinycnn` -- the synthetic sets' CNN, pre-trained on single shapes (``caprl pretrain-tinycnn``).
* :mod:`caprl.features.extract` -- ``caprl features``: one shard of a dataset -> one HDF5 file.
* :mod:`caprl.features.merge` -- ``caprl merge-features``: shard files -> one HDF5 file.
* :mod:`caprl.data.feature_store` -- the HDF5 layout (writer) and :class:`Features` (reader).
"""

from caprl.data.feature_store import Features

__all__ = ["Features"]
