"""A table of results and its Markdown, CSV and LaTeX renderings.

Cells are numbers or None; None renders as "—" (a missing run is never shown as zero), or
as the cell's ``missing`` text when it says why (e.g. "unavailable (SPICE: java not found)").
A cell may carry the paper's number, shown beside ours with the difference.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field


MISSING = "—"


@dataclass
class Cell:
    ours: float | None
    paper: float | None = None
    spread: float | None = None  # e.g. std over seeds
    missing: str = MISSING  # shown instead of a number when ours is None
    decimals: int = 1  # e.g. 2 for the SLE paper's diversity ratios

    def text(self) -> str:
        d = self.decimals
        if self.ours is None:
            mine = self.missing
        else:
            mine = f"{self.ours:.{d}f}" + (f" ± {self.spread:.{d}f}" if self.spread is not None else "")
        if self.paper is None:
            return mine
        diff = "" if self.ours is None else f", {round(self.ours - self.paper, d) + 0.0:+.{d}f}"  # never -0.0
        return f"{mine} (paper {self.paper:.{d}f}{diff})"


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| Approach | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        lines += [f"| {label} | " + " | ".join(c.text() for c in cells) + " |" for label, cells in self.rows]
        lines += [""] + [f"{n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        header = ["approach"]
        for col in self.columns:
            header += [col, f"{col} (paper)", f"{col} (spread)"]
        writer.writerow(header)
        for label, cells in self.rows:
            row: list[str] = [label]
            for c in cells:
                row += ["" if v is None else f"{v:.4f}" for v in (c.ours, c.paper, c.spread)]
                if c.ours is None and c.missing != MISSING:
                    row[-3] = c.missing  # say why, never a number
            writer.writerow(row)
        return buf.getvalue()

    def latex(self) -> str:
        def esc(s: str) -> str:
            return s.replace("\\", "\\textbackslash{}").replace("&", "\\&").replace("%", "\\%").replace("_", "\\_").replace("#", "\\#")

        lines = ["\\begin{table}[t]", "\\centering", f"\\caption{{{esc(self.title)}}}",
                 "\\begin{tabular}{l" + "r" * len(self.columns) + "}", "\\toprule",
                 "Approach & " + " & ".join(esc(c) for c in self.columns) + " \\\\", "\\midrule"]
        lines += [esc(label) + " & " + " & ".join(esc(c.text()).replace("±", "$\\pm$") for c in cells) + " \\\\"
                  for label, cells in self.rows]
        lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
        return "\n".join(lines) + "\n"
