"""``caprl synthesize --dataset NAME``: the built-in generator of a dataset's raw files.

``datasets.<name>.format`` picks the generator: ``karpathy`` writes the synthetic images and
their Karpathy JSON (:mod:`caprl.data.synthetic`), ``tgif`` the synthetic GIFs and their TGIF
TSV with split lists (:mod:`caprl.data.synthetic_video`); both from ``seed`` and the dataset's
``synthetic`` settings alone.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any, Callable

from caprl import params as params_mod
from caprl.data import SPLITS
from caprl.data.synthetic import generate, write_dataset
from caprl.data.synthetic_video import write_video_dataset
from caprl.errors import CaprlError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--out-raw", "--out-json", dest="out_json", required=True, type=Path,
                        help="the raw file to write: Karpathy JSON (format karpathy) or the TGIF TSV (format tgif, "
                             "with the split lists train/val/test.txt beside it)")
    parser.add_argument("--media-dir", "--image-dir", dest="image_dir", required=True, type=Path,
                        help="directory of images (karpathy) or GIFs (tgif) to (re)create")


def _write_images(cfg: dict[str, Any], seed: int, dataset: str, out_raw: Path, media_dir: Path) -> str:
    total = sum(int(cfg[f"n_{s}"]) for s in SPLITS)
    data = write_dataset(generate(cfg, seed, dataset), total, out_raw, media_dir, dataset)
    n_sentences = sum(len(e["sentences"]) for e in data["images"])
    return f"{total} images and {n_sentences} sentences"


def _write_videos(cfg: dict[str, Any], seed: int, dataset: str, out_raw: Path, media_dir: Path) -> str:
    stats = write_video_dataset(cfg, seed, dataset, out_raw, media_dir)
    return f"{stats['videos']} GIFs of {stats['frames']} frames and {stats['sentences']} sentences"


#: the built-in generator of each raw format (datasets.<name>.format with generate: true)
WRITERS: dict[str, Callable[[dict[str, Any], int, str, Path, Path], str]] = {
    "karpathy": _write_images,
    "tgif": _write_videos,
}


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    spec = params_mod.dataset_spec(params, args.dataset)
    cfg = spec["synthetic"]
    out_json, image_dir = Path(args.out_json), Path(args.image_dir)
    if out_json.resolve().is_relative_to(image_dir.resolve()):
        raise CaprlError(f"--out-raw {out_json} lies inside --media-dir (--image-dir) {image_dir}, which is "
                         "replaced as a whole")
    if spec["format"] not in WRITERS:
        raise CaprlError(f"datasets.{args.dataset}.format: the built-in generator writes {', '.join(WRITERS)}, "
                         f"not '{spec['format']}'")
    if not spec["generate"]:
        log.warning("%s: datasets.%s.generate is false; generating it anyway", args.params, args.dataset)
    start = time.perf_counter()
    what = WRITERS[spec["format"]](cfg, int(params["seed"]), args.dataset, out_json, image_dir)
    log.info("wrote %s of %s (%s) to %s and %s in %.1fs", what, args.dataset,
             ", ".join(f"{cfg[f'n_{s}']} {s}" for s in SPLITS), image_dir, out_json, time.perf_counter() - start)
