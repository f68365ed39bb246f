"""What every artefact records of the annotations it was made from, and the check of it.

Files made from a dataset's annotations (features, labels, document frequencies, references,
checkpoints) record ``dataset`` (the annotations' name) and ``annotations_sha``
(:func:`fingerprint`: the images' ids and splits). A stage that reads such a file with the
annotations checks the record before any work (:func:`check`): a file made from other
annotations is refused, both files named, with the command that makes the matching one. A file
without a record (made before caprl recorded one) is accepted with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from caprl.errors import CaprlError

log = logging.getLogger(__name__)

SHA = "annotations_sha"


def fingerprint(annotations: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of every image's id and split, in id order: the
    captions do not enter, so re-tokenising keeps it, while other images or splits do not."""
    pairs = sorted((int(im["id"]), str(im["split"])) for im in annotations["images"])
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


def record(annotations: Mapping[str, Any]) -> dict[str, str]:
    """What a file made from ``annotations`` records: ``{"dataset", "annotations_sha"}``."""
    return {"dataset": str(annotations.get("dataset", "")), SHA: fingerprint(annotations)}


def check(path: str | os.PathLike[str], recorded: Mapping[str, Any], annotations_path: str | os.PathLike[str],
          annotations: Mapping[str, Any], remake: str) -> None:
    """Refuse ``path`` if its record (``recorded``: its ``dataset`` and ``annotations_sha``) says it
    was made from other annotations than ``annotations`` (read from ``annotations_path``);
    ``remake``: the command that makes the matching file."""
    hint = f"make it again from {annotations_path} ({remake})"
    name, made = annotations.get("dataset"), recorded.get("dataset")
    if made and name is not None and str(made) != str(name):
        raise CaprlError(f"{path} was made for dataset '{made}', but {annotations_path} is dataset '{name}': "
                         f"it belongs to other images; {hint}")
    if not recorded.get(SHA):
        log.warning("%s records no annotations fingerprint (made by an older caprl): it cannot be checked against "
                    "%s; %s", path, annotations_path, hint)
        return
    ours = fingerprint(annotations)
    if str(recorded[SHA]) != ours:
        raise CaprlError(f"{path} was made from annotations with fingerprint {recorded[SHA]}, but {annotations_path} "
                         f"has {ours} (other images or splits); {hint}")
