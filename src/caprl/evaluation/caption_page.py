"""Self-contained HTML pages of ``caprl caption``'s captions: every image embedded (base64).

:class:`RunPage`: one run's captions, and for a model with attention over a grid of regions
each word's map over the image (the stage that says the caption; drawn as Stack-Cap Fig. 3
draws them, :mod:`caprl.figures.attention`), written batch by batch.
:func:`write_compare_page` (``caprl caption-page``): several runs' captions of the same images
side by side, one row per image, written row by row. Every caption, name and reason is
HTML-escaped.

Memory stays bounded for any number of images: an image is embedded as a thumbnail (its longer
side at most :data:`THUMBNAIL` pixels; each word's map over one of :data:`ATTENTION_SIDE`), and
a page's items go to a spool file as they are made (its header, which counts them, is written
last, then the items copied after it), never all held at once.
"""

from __future__ import annotations

import argparse
import base64
import html
import io as bytes_io
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

import numpy as np
from PIL import Image
from tqdm import tqdm

from caprl import io
from caprl.errors import CaprlError

log = logging.getLogger(__name__)

THUMBNAIL = 192  # pixels, the longer side of an embedded image
ATTENTION_SIDE = 96  # pixels, the image under each word's map

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
.made { color: #555; font-size: 0.85em; } .made code { background: #f3f3f3; padding: 0 0.2em; }
.items { display: flex; flex-wrap: wrap; gap: 1em; }
.item { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em; margin: 0; max-width: 100%; }
.item img.thumb { display: block; border-radius: 3px; }
.caption { font-size: 1.05em; font-weight: 600; margin-top: 0.4em; }
.file, .score { color: #666; font-size: 0.8em; }
.attention { display: flex; flex-wrap: wrap; gap: 0.3em; margin-top: 0.5em; }
.word { margin: 0; text-align: center; font-size: 0.8em; }
table { border-collapse: collapse; } th, td { border: 1px solid #ddd; padding: 0.4em 0.6em; vertical-align: top; }
th { background: #f6f6f6; text-align: left; }
"""


def e(value: Any) -> str:
    """``value`` as escaped HTML text (quotes too: safe inside attributes)."""
    return html.escape(str(value), quote=True)


def open_rgb(path: str | Path) -> Image.Image:
    """The image at ``path`` as RGB; a CaprlError naming a file that cannot be read (any more:
    ``caprl caption`` read it)."""
    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as exc:
        raise CaprlError(f"{path}: cannot read the image for the page ({exc}); was it moved or changed since it "
                         "was captioned? Caption it again") from exc


def fit(rgb: Image.Image, side: int) -> np.ndarray:
    """``rgb`` with its longer side at most ``side`` pixels (and more than half): a large image
    shrunk, a small one (the synthetic sets' 64 pixels) enlarged as it is, pixels."""
    longer = max(rgb.size)
    if longer > side:  # a new image: ``rgb`` (the one the backbone reads) stays as it is
        scale = side / longer
        rgb = rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))),
                         Image.Resampling.LANCZOS)
    elif 2 * longer <= side:
        factor = side // longer
        rgb = rgb.resize((rgb.width * factor, rgb.height * factor), Image.Resampling.NEAREST)
    return np.asarray(rgb)


def image_array(path: str | Path, side: int) -> np.ndarray:
    """The image at ``path`` as RGB, fitted to ``side`` pixels (:func:`fit`)."""
    return fit(open_rgb(path), side)


def data_uri(png: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(png).decode('ascii')}"


def thumbnail_uri(path: str | Path, rgb: Image.Image | None = None) -> str:
    """The image (``rgb``, read from ``path`` if not given) as an embedded JPEG of at most
    :data:`THUMBNAIL` pixels (PNG for a PNG or GIF file: flat colours stay clean)."""
    image = Image.fromarray(fit(rgb if rgb is not None else open_rgb(path), THUMBNAIL))
    buffer = bytes_io.BytesIO()
    if Path(path).suffix.lower() in (".png", ".gif"):
        image.save(buffer, format="PNG", optimize=True)
        return data_uri(buffer.getvalue())
    image.save(buffer, format="JPEG", quality=88)
    return data_uri(buffer.getvalue(), "image/jpeg")


@dataclass(frozen=True)
class Views:
    """What the page shows of one image, made when it is read (the full image is then let go):
    its thumbnail (a data URI) and the small image its words' maps are laid over (None where the
    model has no grid)."""

    thumbnail: str
    under_maps: np.ndarray | None


def views_of(path: str | Path, rgb: Image.Image, grid: int) -> Views:
    return Views(thumbnail_uri(path, rgb), fit(rgb, ATTENTION_SIDE) if grid > 0 else None)


def word_maps(under: np.ndarray, words: Sequence[str], maps: np.ndarray, grid: int) -> str:
    """Each word's attention map ``maps [words, R]`` laid over the image ``under`` (RGB, at most
    :data:`ATTENTION_SIDE` pixels) as Stack-Cap Fig. 3 lays it
    (:func:`caprl.evaluation.heatmap.attention_map`, its colour map and opacity), each an
    embedded JPEG above its word."""
    from matplotlib import colormaps

    from caprl.evaluation.heatmap import ALPHA, CMAP, attention_map

    image = under.astype(np.float32)
    height, width = image.shape[:2]
    panels = []
    for word, alpha in zip(words, maps):
        heat = colormaps[CMAP](attention_map(alpha, grid, height, width))[..., :3] * 255.0
        blended = Image.fromarray(((1 - ALPHA) * image + ALPHA * heat).round().astype(np.uint8))
        buffer = bytes_io.BytesIO()
        blended.save(buffer, format="JPEG", quality=85)
        panels.append(f'<figure class="word"><img src="{data_uri(buffer.getvalue(), "image/jpeg")}" '
                      f'alt="attention of {e(word)}"><figcaption>{e(word)}</figcaption></figure>')
    return f'<div class="attention">{"".join(panels)}</div>'


def has_maps(caption: dict[str, Any], grid: int) -> bool:
    maps = caption.get("attention")
    return maps is not None and len(caption["words"]) > 0 and grid > 0 and maps.shape[-1] == grid * grid


def made_by_line(made_by: dict[str, Any]) -> str:
    backbone = made_by.get("backbone") or {}
    parts = [("run", made_by.get("run")), ("dataset", made_by.get("dataset")), ("method", made_by.get("method")),
             ("model", made_by.get("model")), ("checkpoint", made_by.get("checkpoint")),
             ("backbone", backbone.get("name")), ("its settings", backbone.get("settings")),
             ("decode", made_by.get("decode")), ("caprl", made_by.get("code_version"))]
    shown = [(k, json.dumps(v) if isinstance(v, dict) else v) for k, v in parts if v not in (None, "")]
    return " · ".join(f"{e(k)} <code>{e(v)}</code>" for k, v in shown)


def skipped_section(skipped: Sequence[dict[str, str]]) -> str:
    if not skipped:
        return ""
    rows = "".join(f"<li><code>{e(s['file'])}</code>: {e(s['reason'])}</li>" for s in skipped)
    return f'<h2>Skipped: {len(skipped)} unreadable file(s)</h2><ul class="skipped">{rows}</ul>'


def document_head(title: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n")


DOCUMENT_END = "\n</body></html>\n"


class RunPage:
    """One run's page, written to ``out`` (an open text file) an image at a time: :meth:`add` each
    caption (``{"file", "caption", "logprob", "words", "attention" [words, R] or None}``) with its
    :class:`Views`, then :meth:`finish` with ``caprl caption``'s ``made_by`` and ``skipped``.
    The items wait in a spool file beside ``out`` until the header that counts them is written."""

    def __init__(self, out: IO[str], grid: int, spool_dir: str | Path | None = None) -> None:
        self.out, self.grid, self.count, self.maps = out, grid, 0, False
        self.spool = tempfile.TemporaryFile("w+", encoding="utf-8", dir=spool_dir)  # unnamed: gone when closed

    def add(self, caption: dict[str, Any], views: Views) -> None:
        attention = ""
        if views.under_maps is not None and has_maps(caption, self.grid):
            attention, self.maps = word_maps(views.under_maps, caption["words"], caption["attention"], self.grid), True
        self.spool.write(f'<figure class="item"><img class="thumb" src="{views.thumbnail}" alt="{e(caption["file"])}">'
                         f'<figcaption><div class="caption">{e(caption["caption"])}</div>'
                         f'<div class="file">{e(caption["file"])}</div>'
                         f'<div class="score">log p = {caption["logprob"]:.3f}</div></figcaption>{attention}</figure>')
        self.count += 1

    def finish(self, made_by: dict[str, Any], skipped: Sequence[dict[str, str]]) -> None:
        note = (f"<p class=\"made\">Under each caption: each word's attention over the image ({self.grid}x{self.grid} "
                "regions; red: most attended).</p>" if self.maps else "")
        self.out.write(document_head(f"caprl captions: {made_by.get('run')}"))
        self.out.write(f"<h1>Captions of run {e(made_by.get('run') or made_by.get('checkpoint'))}: {self.count} "
                       f'images</h1><p class="made">{made_by_line(made_by)}</p>{note}<div class="items">')
        self.spool.seek(0)
        shutil.copyfileobj(self.spool, self.out)
        self.out.write(f"</div>{skipped_section(skipped)}{DOCUMENT_END}")
        self.close()

    def close(self) -> None:
        self.spool.close()


def run_page(result: dict[str, Any], captions: Sequence[dict[str, Any]], grid: int) -> str:
    """One run's page as a string (:class:`RunPage`, each image read from its ``path``): ``result``
    as ``caprl caption`` writes it; ``captions`` with each image's ``words`` and ``attention``
    (``[words, R]`` or None) for the maps over a ``grid`` x ``grid`` layout."""
    out = bytes_io.StringIO()
    page = RunPage(out, grid)
    try:
        for c in captions:
            page.add(c, views_of(c["path"], open_rgb(c["path"]), grid))
        page.finish(result["made_by"], result.get("skipped", []))
    finally:
        page.close()
    return out.getvalue()


def check_same_images(results: Sequence[dict[str, Any]], sources: Sequence[str]) -> None:
    """A CaprlError naming two captions files (``sources``) of different images."""
    files = [[c["file"] for c in r["captions"]] for r in results]
    for k in range(1, len(results)):
        if files[k] != files[0]:
            other = sorted(set(files[k]) ^ set(files[0]))[:3]
            raise CaprlError(f"{sources[k]} and {sources[0]} captioned different images (e.g. {other}): caption the "
                             "same images with every run")


def write_compare_page(out: IO[str], results: Sequence[dict[str, Any]], sources: Sequence[str]) -> None:
    """Several runs' captions of the same images side by side (``results`` read from ``sources``),
    written to ``out`` row by row; a CaprlError naming two files that captioned different images."""
    check_same_images(results, sources)
    runs = [r["made_by"].get("run") or src for r, src in zip(results, sources)]
    runs_list = "".join(f'<li class="made">{made_by_line(r["made_by"])}</li>' for r in results)
    out.write(document_head(f"caprl captions: {', '.join(map(str, runs))}"))
    out.write(f"<h1>{len(results)} runs, {len(results[0]['captions'])} images</h1><ul>{runs_list}</ul><table><tr>"
              "<th>image</th>" + "".join(f"<th>{e(run)}</th>" for run in runs) + "</tr>")
    for i, first in enumerate(tqdm(results[0]["captions"], desc="page", unit="img", mininterval=2.0, disable=None)):
        cells = "".join(f'<td class="caption">{e(r["captions"][i]["caption"])}</td>' for r in results)
        out.write(f'<tr><td><img class="thumb" src="{thumbnail_uri(first["path"])}" alt="{e(first["file"])}">'
                  f'<div class="file">{e(first["file"])}</div></td>{cells}</tr>')
    out.write(f"</table>{skipped_section(results[0].get('skipped', []))}{DOCUMENT_END}")


def compare_page(results: Sequence[dict[str, Any]], sources: Sequence[str]) -> str:
    """:func:`write_compare_page` as a string."""
    out = bytes_io.StringIO()
    write_compare_page(out, results, sources)
    return out.getvalue()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--captions", nargs="+", required=True, metavar="JSON",
                        help="captions files of `caprl caption`, one per run, of the same images")
    parser.add_argument("--out", required=True, help="output: the side-by-side page (HTML)")


def main(args: argparse.Namespace) -> None:
    results = [io.read_json(path, "captions file (made by `caprl caption`)") for path in args.captions]
    for path, result in zip(args.captions, results):
        if not isinstance(result, dict) or "captions" not in result or "made_by" not in result:
            raise CaprlError(f"{path}: not a captions file of `caprl caption` (no captions/made_by); make it again")
    check_same_images(results, [str(p) for p in args.captions])  # before the output's temporary file
    with io.atomic_path(args.out) as tmp, open(tmp, "w", encoding="utf-8") as out:
        write_compare_page(out, results, [str(p) for p in args.captions])
    log.info("%d runs' captions of %d images -> %s", len(results), len(results[0]["captions"]), args.out)
