"""A paper's claims as a forest plot: each claim's paired difference (a - b; b - a for '<') with its
95% interval over the seeds, against 0 (or -margin for '≥'), coloured by its verdict; Holm's verdict
and the paper's own statement (the claim's source) beside it. A claim without an interval (a seed
without a value, a single seed) is a row that says why. Drawn on matplotlib's Agg canvas, no version in the bytes:
the same results give the same PNG.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from caprl import io

COLOURS = {"holds": "#1b7837", "reversed": "#b2182b", "unresolved": "#6b6b6b"}


def forest_png(config: dict[str, Any], results: list[dict[str, Any]], path: Path) -> None:
    """Write the paper's forest plot to ``path`` (atomically)."""
    n = max(len(results), 1)
    height = 1.3 + 0.55 * n  # inches: 0.75 below the rows (axis, label), 0.55 above (title)
    fig = Figure(figsize=(12.0, height))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.33, 0.75 / height, 0.29, 0.55 * n / height))
    finite = [x for r in results for x in (r["lo"], r["hi"], -r["margin"]) if math.isfinite(x)]
    span = (min(finite + [0.0]), max(finite + [0.0]))
    pad = 0.08 * (span[1] - span[0] or 1.0)
    ax.set_xlim(span[0] - pad, span[1] + pad)
    ax.set_ylim(n - 0.5, -0.5)
    ax.axvline(0.0, color="black", linewidth=0.8)
    for row, r in enumerate(results):
        colour = COLOURS[r["verdict"]]
        if r["kind"] == "at_least":
            ax.plot([-r["margin"]] * 2, [row - 0.4, row + 0.4], color="#999999", linestyle="--", linewidth=0.8)
        if not (math.isfinite(r["lo"]) and math.isfinite(r["hi"])):  # a seed without a value; a single seed
            why = textwrap.shorten(r["missing"][0] if r["missing"] else f"{r['n']} seed(s): no interval", 52)
            ax.text(0.02, row, f"no interval:\n{why}", transform=ax.get_yaxis_transform(), va="center", ha="left",
                    fontsize=6.5, color=colour)
        else:
            ax.plot([r["lo"], r["hi"]], [row, row], color=colour, linewidth=2.0)
            ax.plot([r["diff"]], [row], "o", color=colour, markersize=5)
        ax.text(-0.02, row, textwrap.shorten(r["text"], 60), transform=ax.get_yaxis_transform(), ha="right",
                va="center", fontsize=8)
        holm = r.get("holm", "unresolved")
        ax.text(1.03, row, f"{r['verdict']} (Holm: {holm})\npaper: " + textwrap.shorten(r["source"], 62),
                transform=ax.get_yaxis_transform(), ha="left", va="center", fontsize=7, color=colour)
    ax.set_yticks([])
    ax.set_xlabel("paired difference a - b over the seeds (mean, 95% t-interval; each claim in its metric's units)",
                  fontsize=8)
    ax.set_title(f"Paper {config['paper']}: {textwrap.shorten(config['title'], 90)}", fontsize=9)
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
