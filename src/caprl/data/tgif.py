"""TGIF (Li et al. 2016) raw files -> normalised annotations (the format of caprl.data.prepare).

* ``raw``: ``tgif-v1.0.tsv``, one ``<GIF URL>\\t<sentence>`` per line (a GIF may have several).
* Split lists beside it: ``<split>.txt`` or ``splits/<split>.txt`` for train, val and test,
  one GIF URL per line (the official release's lists).
* ``media_root``: the GIFs, each named by its URL's file name (``tumblr_..._400.gif``).

Image ids are the GIFs' positions in the sorted list of file names (1-based), so they are
the same on every machine. GIFs in the TSV but in no split list are dropped and counted;
a GIF in two splits is an error. (Issue 10: per-frame features are the next slice.)
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from caprl.data import SPLITS
from caprl.data.prepare import tokenize
from caprl.errors import CaprlError


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


def read_tgif(raw: Path, media_root: Path, dataset: str) -> dict[str, Any]:
    """Annotations of the TGIF files (layout in the module docstring); every listed GIF must exist."""
    if not raw.is_file():
        raise CaprlError(f"TGIF sentences not found: {raw} (params datasets.{dataset}.raw); get tgif-v1.0.tsv "
                         "from the TGIF release")
    split_of: dict[str, str] = {}
    for split, path in split_lists(raw).items():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            name = gif_name(line)
            if split_of.setdefault(name, split) != split:
                raise CaprlError(f"{path}:{n}: {name} is in both the {split_of[name]} and the {split} lists")
    captions: dict[str, list[tuple[list[str], str]]] = defaultdict(list)
    stats = {"captions_read": 0, "empty_captions_dropped": 0, "not_in_a_split": 0}
    unlisted: set[str] = set()
    for n, line in enumerate(raw.read_text(encoding="utf-8").splitlines(), start=1):
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
    stats.update(images=len(images), captions=sum(len(im["captions"]) for im in images),
                 split_images={s: sum(im["split"] == s for im in images) for s in SPLITS})
    return {"dataset": dataset, "images": images, "stats": stats}
