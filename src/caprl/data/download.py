"""``caprl download --dataset NAME --out DIR``: fetch a real dataset's public files.

What lands under ``--out`` (point it at the folder params.yaml names for the dataset)::

    coco       train2014.zip, val2014.zip, annotations_trainval2014.zip, unpacked to
               train2014/, val2014/, annotations/          (--out data/raw/coco)
    karpathy   caption_datasets.zip, unpacked: dataset_coco.json, dataset_flickr30k.json, ...
    tgif       tgif-v1.0.tsv, splits/{train,val,test}.txt, and gifs/<file name of each GIF URL>
               for every GIF the TSV lists                  (--out data/raw/tgif)
    flickr30k  not downloadable (a request form): a CaprlError says where to get it and where to put it

Not fetched here: the bottom-up-attention features of COCO (``datasets.<name>.backbone:
bottomup``, :mod:`caprl.data.bottomup`); the workflow says where to get them when they are missing.

How each file is fetched (atomic ``.part`` files, Range resume, retries with backoff, checksum
checks, a bounded pool) and the two manifests kept in ``--out`` (``checksums.json``,
``download_failures.json``) are described in :mod:`caprl.data.fetch`; some downloads failing ends
the command with a CaprlError (exit 2) after the rest are done, and running it again retries them.

Checksums: :data:`SOURCES` carries only published ones (COCO 2014: sizes and sha256 as listed by
TensorFlow Datasets' ``url_checksums/coco.txt``). Where none is published (Karpathy's zip, the
TGIF files, each GIF), the sha256 computed at the first download is recorded in
``<out>/checksums.json`` and every later download of that file must match it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from caprl import io
from caprl.data import SPLITS
from caprl.data.fetch import Downloader, Source
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

_COCO = "http://images.cocodataset.org/"
_TGIF = "https://raw.githubusercontent.com/raingo/TGIF-Release/master/data/"
SOURCES: dict[str, tuple[Source, ...]] = {
    "coco": (  # sizes and sha256 from TensorFlow Datasets' url_checksums/coco.txt
        Source(_COCO + "zips/train2014.zip", "train2014.zip", 13_510_573_713,
               "ede4087e640bddba550e090eae701092534b554b42b05ac33f0300b984b31775", extract=True),
        Source(_COCO + "zips/val2014.zip", "val2014.zip", 6_645_013_297,
               "fe9be816052049c34717e077d9e34aa60814a55679f804cd043e3cbee3b9fde0", extract=True),
        Source(_COCO + "annotations/annotations_trainval2014.zip", "annotations_trainval2014.zip", 252_872_794,
               "031296bbc80c45a1d1f76bf9a90ead27e94e99ec629208449507a4917a3bf009", extract=True),
    ),
    "karpathy": (  # no published checksum: recorded in checksums.json at the first download
        Source("https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip", "caption_datasets.zip",
               extract=True),
    ),
    "tgif": (  # no published checksums; the GIFs listed in the TSV follow (gifs/)
        Source(_TGIF + "tgif-v1.0.tsv", "tgif-v1.0.tsv"),
        *(Source(_TGIF + f"splits/{split}.txt", f"splits/{split}.txt") for split in SPLITS),
    ),
}
DATASETS = (*SOURCES, "flickr30k")


def extract_zip(archive: Path, into: Path) -> list[str]:
    """Unpack ``archive`` into ``into``; returns its top-level entries.

    Each top-level entry appears by one rename from a temporary folder beside it, so an
    interrupted run leaves whole entries or none; entries already there are kept. A marker
    ``.<archive name>.extracted`` records a finished unpacking (later runs skip it).
    """
    marker = into / f".{archive.name}.extracted"
    if marker.exists():
        return marker.read_text(encoding="utf-8").split()
    tmp = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", dir=into))
    try:
        log.info("unpacking %s into %s", archive, into)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        entries = sorted(p.name for p in tmp.iterdir())
        for name in entries:
            if (into / name).exists():
                log.info("%s is already there; kept", into / name)
                continue
            os.replace(tmp / name, into / name)
        io.write_text(marker, "\n".join(entries) + "\n")
        return entries
    except zipfile.BadZipFile as exc:
        raise CaprlError(f"{archive}: not a readable zip ({exc}); delete it and download again") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gif_sources(tsv: Path, limit: int | None = None) -> list[Source]:
    """One source per distinct GIF of ``tgif-v1.0.tsv`` (file order), stored as ``gifs/<URL's file name>``."""
    from caprl.data.tgif import gif_name

    sources: dict[str, Source] = {}
    try:
        text = tsv.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CaprlError(f"{tsv}: not UTF-8 text (byte {exc.start}); delete it and download it again") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        url, tab, _sentence = line.partition("\t")
        if not tab:
            raise CaprlError(f"{tsv}:{n}: expected '<GIF URL>\\t<sentence>', found no tab")
        try:
            name = gif_name(url)
        except ValueError as exc:
            raise CaprlError(f"{tsv}:{n}: {exc}") from None
        sources.setdefault(name, Source(url.strip(), f"gifs/{name}"))
        if limit is not None and len(sources) >= limit:
            break
    return list(sources.values())


def download(dataset: str, out: str | os.PathLike[str], *, base_url: str | None = None, workers: int = 8,
             retries: int = 3, backoff: float = 1.0, timeout: float = 60.0, limit: int | None = None,
             extract: bool = True, verify: bool = False) -> dict[Path, str | None]:
    """Download ``dataset``'s files into ``out`` (layout and guarantees in the module docstring)."""
    root = Path(out)
    if dataset == "flickr30k":
        raise CaprlError("Flickr30k cannot be downloaded by caprl: its images are given out after a request form at "
                         "https://shannon.cs.illinois.edu/DenotationGraph/ . Put every image in "
                         f"{root / 'flickr30k-images'}/ (params datasets.flickr30k.media_root) and "
                         "dataset_flickr30k.json (caprl download --dataset karpathy) at "
                         f"{root / 'dataset_flickr30k.json'} (datasets.flickr30k.raw), then set "
                         "datasets.flickr30k.enabled: true")
    if dataset not in SOURCES:
        raise CaprlError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if limit is not None and (limit < 1 or dataset != "tgif"):
        raise CaprlError(f"--limit {limit}: a positive number of GIFs, for --dataset tgif only")
    root.mkdir(parents=True, exist_ok=True)
    runner = Downloader(dataset, root, base_url=base_url, workers=workers, retries=retries, backoff=backoff,
                        timeout=timeout, verify=verify)
    fetched = runner.run(SOURCES[dataset], desc=dataset)
    if dataset == "tgif":
        gifs = gif_sources(root / "tgif-v1.0.tsv", limit)
        log.info("%d GIFs listed in %s%s", len(gifs), root / "tgif-v1.0.tsv", f" (--limit {limit})" if limit else "")
        fetched.update(runner.run(gifs, desc="TGIF GIFs"))
    if extract:
        for src in SOURCES[dataset]:
            if src.extract:
                entries = extract_zip(root / src.dest, root)
                log.info("%s -> %s", src.dest, ", ".join(entries))
    if dataset == "karpathy":
        log.info("dataset_coco.json belongs at datasets.coco.raw (data/raw/coco/), dataset_flickr30k.json at "
                 "datasets.flickr30k.raw (data/raw/flickr30k/)")
    return fetched


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--out", required=True, help="folder for the files (the dataset's folder, e.g. data/raw/coco)")
    parser.add_argument("--workers", type=int, default=8, help="downloads at once (default 8)")
    parser.add_argument("--retries", type=int, default=3, help="retries of a failed download (default 3)")
    parser.add_argument("--backoff", type=float, default=1.0,
                        help="seconds before the first retry, doubled for each next one (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a retry (default 60)")
    parser.add_argument("--limit", type=int, default=None, help="tgif: only the first N GIFs of the TSV (to try it)")
    parser.add_argument("--base-url", default=None,
                        help="a mirror: replaces the scheme and host of every URL (its path is prefixed)")
    parser.add_argument("--no-extract", action="store_true", help="keep the zip archives packed")
    parser.add_argument("--verify", action="store_true",
                        help="re-hash files already there against their checksums (re-download on mismatch)")


def main(args: argparse.Namespace) -> None:
    download(args.dataset, args.out, base_url=args.base_url, workers=args.workers, retries=args.retries,
             backoff=args.backoff, timeout=args.timeout, limit=args.limit, extract=not args.no_extract,
             verify=args.verify)
