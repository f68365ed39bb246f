"""Self-contained HTML pages of ``caprl caption``'s captions: every image embedded (base64).

:func:`run_page`: one run's captions, and for a model with attention over a grid of regions
each word's map over the image (the stage that says the caption; drawn as Stack-Cap Fig. 3
draws them, :mod:`caprl.figures.attention`).
:func:`compare_page` (``caprl caption-page``): several runs' captions of the same images side
by side, one row per image. Every caption, name and reason is HTML-escaped.
"""

from __future__ import annotations

import argparse
import base64
import html
import io as bytes_io
import json
import logging
from pathlib import Path
from typing import Any, Sequence

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


def image_array(path: str | Path, side: int) -> np.ndarray:
    """The image at ``path`` as RGB, its longer side at most ``side`` pixels (and more than half); a CaprlError naming
    a file that cannot be read (any more: ``caprl caption`` read it)."""
    try:
        with Image.open(path) as img:
            img.load()
            rgb = img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as exc:
        raise CaprlError(f"{path}: cannot read the image for the page ({exc}); was it moved or changed since it "
                         "was captioned? Caption it again") from exc
    longer = max(rgb.size)
    if longer > side:
        rgb.thumbnail((side, side), Image.Resampling.LANCZOS)
    elif 2 * longer <= side:  # a small image (the synthetic sets' 64 pixels), enlarged as it is: pixels
        factor = side // longer
        rgb = rgb.resize((rgb.width * factor, rgb.height * factor), Image.Resampling.NEAREST)
    return np.asarray(rgb)


def data_uri(png: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(png).decode('ascii')}"


def thumbnail_uri(path: str | Path) -> str:
    """The image as an embedded JPEG (PNG for a PNG or GIF file: flat colours stay clean)."""
    image = Image.fromarray(image_array(path, THUMBNAIL))
    buffer = bytes_io.BytesIO()
    if Path(path).suffix.lower() in (".png", ".gif"):
        image.save(buffer, format="PNG", optimize=True)
        return data_uri(buffer.getvalue())
    image.save(buffer, format="JPEG", quality=88)
    return data_uri(buffer.getvalue(), "image/jpeg")


def word_maps(path: str | Path, words: Sequence[str], maps: np.ndarray, grid: int) -> str:
    """Each word's attention map ``maps [words, R]`` laid over the image as Stack-Cap Fig. 3 lays
    it (:func:`caprl.evaluation.heatmap.attention_map`, its colour map and opacity), each an
    embedded JPEG above its word."""
    from matplotlib import colormaps

    from caprl.evaluation.heatmap import ALPHA, CMAP, attention_map

    image = image_array(path, ATTENTION_SIDE).astype(np.float32)
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


def document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def run_page(result: dict[str, Any], captions: Sequence[dict[str, Any]], grid: int) -> str:
    """One run's page: ``result`` as ``caprl caption`` writes it; ``captions`` with each image's
    ``words`` and ``attention`` (``[words, R]`` or None) for the maps over a ``grid`` x ``grid`` layout."""
    made_by = result["made_by"]
    items = []
    drawn = [c for c in captions if has_maps(c, grid)]
    maps = {c["path"]: word_maps(c["path"], c["words"], c["attention"], grid)
            for c in tqdm(drawn, desc="attention maps", unit="img", mininterval=2.0, disable=None)}
    for c in captions:
        attention = maps.get(c["path"], "")
        items.append(f'<figure class="item"><img class="thumb" src="{thumbnail_uri(c["path"])}" alt="{e(c["file"])}">'
                     f'<figcaption><div class="caption">{e(c["caption"])}</div><div class="file">{e(c["file"])}</div>'
                     f'<div class="score">log p = {c["logprob"]:.3f}</div></figcaption>{attention}</figure>')
    note = (f"<p class=\"made\">Under each caption: each word's attention over the image ({grid}x{grid} regions; "
            "red: most attended).</p>" if maps else "")
    body = (f"<h1>Captions of run {e(made_by.get('run') or made_by.get('checkpoint'))}: {len(captions)} images</h1>"
            f'<p class="made">{made_by_line(made_by)}</p>{note}<div class="items">{"".join(items)}</div>'
            f"{skipped_section(result.get('skipped', []))}")
    return document(f"caprl captions: {made_by.get('run')}", body)


def compare_page(results: Sequence[dict[str, Any]], sources: Sequence[str]) -> str:
    """Several runs' captions of the same images side by side (``results`` read from ``sources``);
    a CaprlError naming two files that captioned different images."""
    files = [[c["file"] for c in r["captions"]] for r in results]
    for k in range(1, len(results)):
        if files[k] != files[0]:
            other = sorted(set(files[k]) ^ set(files[0]))[:3]
            raise CaprlError(f"{sources[k]} and {sources[0]} captioned different images (e.g. {other}): caption the "
                             "same images with every run")
    runs = [r["made_by"].get("run") or src for r, src in zip(results, sources)]
    head = "<tr><th>image</th>" + "".join(f"<th>{e(run)}</th>" for run in runs) + "</tr>"
    rows = []
    for i, first in enumerate(tqdm(results[0]["captions"], desc="page", unit="img", mininterval=2.0, disable=None)):
        cells = "".join(f'<td class="caption">{e(r["captions"][i]["caption"])}</td>' for r in results)
        rows.append(f'<tr><td><img class="thumb" src="{thumbnail_uri(first["path"])}" alt="{e(first["file"])}">'
                    f'<div class="file">{e(first["file"])}</div></td>{cells}</tr>')
    runs_list = "".join(f'<li class="made">{made_by_line(r["made_by"])}</li>' for r in results)
    body = (f"<h1>{len(results)} runs, {len(rows)} images</h1><ul>{runs_list}</ul>"
            f"<table>{head}{''.join(rows)}</table>{skipped_section(results[0].get('skipped', []))}")
    return document(f"caprl captions: {', '.join(map(str, runs))}", body)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--captions", nargs="+", required=True, metavar="JSON",
                        help="captions files of `caprl caption`, one per run, of the same images")
    parser.add_argument("--out", required=True, help="output: the side-by-side page (HTML)")


def main(args: argparse.Namespace) -> None:
    results = [io.read_json(path, "captions file (made by `caprl caption`)") for path in args.captions]
    for path, result in zip(args.captions, results):
        if not isinstance(result, dict) or "captions" not in result or "made_by" not in result:
            raise CaprlError(f"{path}: not a captions file of `caprl caption` (no captions/made_by); make it again")
    io.write_text(args.out, compare_page(results, [str(p) for p in args.captions]))
    log.info("%d runs' captions of %d images -> %s", len(results), len(results[0]["captions"]), args.out)
