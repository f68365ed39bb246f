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


def features_record(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What a model trained on a features file records of it: the backbone, its settings (without
    the code version that extracted them: same settings, same features), the vector sizes."""
    try:
        settings = json.loads(str(attrs.get("backbone_config", "{}")))
    except json.JSONDecodeError:
        settings = {"raw": str(attrs.get("backbone_config"))}
    if isinstance(settings, dict):
        settings.pop("code_version", None)
    return {"backbone": str(attrs.get("backbone", "")), "settings": settings, "dim": int(attrs.get("dim", 0)),
            "n_regions": int(attrs.get("n_regions", 0))}


def check_model_inputs(checkpoint_path: str | os.PathLike[str], made_from: Mapping[str, Any],
                       features_path: str | os.PathLike[str], attrs: Mapping[str, Any],
                       annotations_path: str | os.PathLike[str], annotations: Mapping[str, Any]) -> None:
    """A checkpoint is read with the features and annotations it was trained with: its record
    (``made_from``: :func:`record` and ``features``: :func:`features_record`) against theirs. A
    checkpoint without one (an older caprl's) is read with a warning."""
    if not made_from:
        log.warning("%s records no provenance (made by an older caprl): its features and annotations cannot be "
                    "checked against %s and %s", checkpoint_path, features_path, annotations_path)
        return
    trained, given = made_from.get("features") or {}, features_record(attrs)
    differ = [k for k in ("backbone", "settings", "dim", "n_regions") if trained.get(k) != given[k]]
    if differ:
        what = "; ".join(f"{k} {trained.get(k)!r} there, {given[k]!r} here" for k in differ)
        raise CaprlError(f"{checkpoint_path} was trained on other features than {features_path} ({what}): its "
                         "captions would be gibberish; give it the features it was trained with, or train the run "
                         "on these")
    check(checkpoint_path, made_from, annotations_path, annotations, "train the run on these annotations")
