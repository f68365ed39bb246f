"""TGIF (Li et al. 2016) raw files -> normalised annotations (the format of caprl.data.prepare).

* ``raw``: ``tgif-v1.0.tsv``, one ``<GIF URL>\\t<sentence>`` per line (a GIF may have several).
* Split lists beside it: ``<split>.txt`` or ``splits/<split>.txt`` for train, val and test,
  one GIF URL per line (the official release's lists).
* ``media_root``: the GIFs, each named by its URL's file name (``tumblr_..._400.gif``).

Image ids are the GIFs' positions in the sorted list of file names (1-based), so they are
the same on every machine (a GIF skipped below keeps its id unused). GIFs in the TSV but in
no split list are dropped and counted; a GIF in two splits is an error; every listed GIF must
exist under ``media_root``.

Every GIF is then probed (:func:`caprl.data.gif.probe`: size, pixels, and each frame decoded
in turn, one at a time) with the limits of params.yaml ``features.video``. A GIF that cannot
give frames (a single frame, a truncated or corrupt file, too large) is, by
``features.video.on_failure``, left out and listed -- ``stats["skipped_media"]``, a list of
``{"file", "kind", "detail"}``, and one WARNING log line per file plus a count -- (``skip``)
or a :class:`caprl.data.gif.GifError` naming the file, the kind and what to do (``stop``).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from tqdm import tqdm

from caprl import io
from caprl.data import SPLITS
from caprl.data.gif import GifError, GifLimits, gif_limits, probe, video_settings
from caprl.data.karpathy import tokenize
from caprl.errors import CaprlError

log = logging.getLogger(__name__)


def gif_name(url: str) -> str:
    """The file name a GIF is stored under: the last part of its URL's path."""
    name = Path(urlparse(url.strip()).path).name
    if not name:
        raise ValueError(f"no file name in URL {url!r}")
    return name


def split_lists(raw: Path) -> dict[str, Path]:
    found = {}
    for split in SPLITS:
        for candidate in (raw.parent / f"{split}.txt", raw.parent / "splits" / f"{split}.txt"):
            if candidate.is_file():
                found[split] = candidate
                break
    if "train" not in found:
        raise CaprlError(f"{raw}: no TGIF split list train.txt beside it (or in splits/); get the official "
                         "split files (train.txt, val.txt, test.txt) from the TGIF release")
    return found


def stop_hint(dataset: str) -> str:
    return (f"a GIF of datasets.{dataset}: re-download it, or take it out of the split lists, or set "
            "features.video.on_failure: skip in params.yaml to leave such GIFs out (they are listed)")


def check_gifs(images: list[dict[str, Any]], media_root: Path, dataset: str, policy: str,
               limits: GifLimits) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Probe every GIF of ``images``: ``(kept images, skipped [{file, kind, detail}])`` under
    ``policy`` ``skip``; the first failure raised (a GifError with what to do) under ``stop``."""
    kept, skipped = [], []
    for im in tqdm(images, desc=f"checking GIFs of {dataset}", unit="gif", mininterval=5.0, disable=None):
        try:
            probe(media_root / im["file"], limits)
        except GifError as exc:
            if policy == "stop":
                raise exc.with_hint(stop_hint(dataset)) from None
            log.warning("skipped %s: %s GIF (%s)", exc.path, exc.kind.replace("_", " "), exc.detail)
            skipped.append({"file": im["file"], "kind": exc.kind, "detail": exc.detail})
            continue
        kept.append(im)
    if skipped:
        kinds = Counter(s["kind"] for s in skipped)
        log.warning("skipped %d of %d GIFs of %s (features.video.on_failure: skip): %s", len(skipped), len(images),
                    dataset, ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())))
    return kept, skipped


def read_tgif(raw: Path, media_root: Path, dataset: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Annotations of the TGIF files (layout and GIF checks in the module docstring).

    ``settings``: params.yaml ``features.video`` (``on_failure``, ``max_mib``; None: the
    defaults of :data:`caprl.data.gif.VIDEO_DEFAULTS`)."""
    video = video_settings(settings)
    if not raw.is_file():
        raise CaprlError(f"TGIF sentences not found: {raw} (params datasets.{dataset}.raw); get tgif-v1.0.tsv "
                         "from the TGIF release")
    split_of: dict[str, str] = {}
    for split, path in split_lists(raw).items():
        for n, line in enumerate(io.read_text(path, "TGIF split list").splitlines(), start=1):
            if not line.strip():
                continue
            name = gif_name(line)
            if split_of.setdefault(name, split) != split:
                raise CaprlError(f"{path}:{n}: {name} is in both the {split_of[name]} and the {split} lists")
    captions: dict[str, list[tuple[list[str], str]]] = defaultdict(list)
    stats = {"captions_read": 0, "empty_captions_dropped": 0, "not_in_a_split": 0}
    unlisted: set[str] = set()
    for n, line in enumerate(io.read_text(raw, "TGIF sentence file").splitlines(), start=1):
        if not line.strip():
            continue
        url, tab, sentence = line.partition("\t")
        if not tab:
            raise CaprlError(f"{raw}:{n}: expected '<GIF URL>\\t<sentence>', found no tab")
        name = gif_name(url)
        stats["captions_read"] += 1
        if name not in split_of:
            unlisted.add(name)
            continue
        tokens = tokenize(sentence)
        if not tokens:
            stats["empty_captions_dropped"] += 1
            continue
        captions[name].append((tokens, sentence.strip()))
    stats["not_in_a_split"] = len(unlisted)
    images = [{"id": k + 1, "file": name, "split": split_of[name], "captions": [c for c, _ in captions[name]],
               "raw": [r for _, r in captions[name]]} for k, name in enumerate(sorted(captions))]
    if not images:
        raise CaprlError(f"{raw}: no GIF of the split lists has a sentence")
    missing = [im["file"] for im in images if not (media_root / im["file"]).is_file()]
    if missing:
        raise CaprlError(f"{len(missing)} of {len(images)} GIFs are missing under {media_root} "
                         f"(params datasets.{dataset}.media_root): {', '.join(missing[:5])}"
                         f"{', ...' if len(missing) > 5 else ''}")
    images, skipped = check_gifs(images, media_root, dataset, video["on_failure"], gif_limits(video))
    if not images:
        raise CaprlError(f"{raw}: every GIF of the split lists was skipped ({len(skipped)}, see the warnings); "
                         f"check datasets.{dataset}.media_root and re-download the GIFs")
    stats["skipped_media"] = skipped
    stats.update(images=len(images), captions=sum(len(im["captions"]) for im in images),
                 split_images={s: sum(im["split"] == s for im in images) for s in SPLITS})
    return {"dataset": dataset, "images": images, "stats": stats}
