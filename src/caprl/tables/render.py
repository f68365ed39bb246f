"""A table of results and its Markdown, CSV and LaTeX renderings.

Cells are numbers or None; None renders as "—" (a missing run is never shown as zero), or
as the cell's ``missing`` text when it says why (e.g. "unavailable (SPICE: java not found)").
A cell may carry the paper's number, shown beside ours with the difference. A cell may carry
``flags`` (why its number is suspect, e.g. a run whose captions are degenerate, see
:mod:`caprl.evaluation.degenerate`): its row's label gets :data:`FLAG` and the table a
footnote ``FLAG <flag>`` (Markdown) per flag, each once.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field


MISSING = "—"
FLAG = "⚠"  # after the label of a row whose numbers are suspect; the footnote says why


@dataclass
class Cell:
    ours: float | None
    paper: float | None = None
    spread: float | None = None  # e.g. std over seeds
    missing: str = MISSING  # shown instead of a number when ours is None
    decimals: int = 1  # e.g. 2 for the SLE paper's diversity ratios
    flags: tuple[str, ...] = ()  # why this number is suspect (marks its row with FLAG, footnotes say why)

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

    @staticmethod
    def label(label: str, cells: list[Cell], marker: str = FLAG) -> str:
        """The row's label, with ``marker`` when one of its cells is flagged."""
        return f"{label} {marker}" if any(c.flags for c in cells) else label

    def flag_notes(self) -> list[str]:
        """One footnote per distinct flag of the table's cells, in row order."""
        flags = dict.fromkeys(flag for _, cells in self.rows for c in cells for flag in c.flags)
        return [f"{FLAG} {flag}" for flag in flags]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| Approach | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        lines += [f"| {self.label(label, cells)} | " + " | ".join(c.text() for c in cells) + " |"
                  for label, cells in self.rows]
        lines += [""] + [f"{n}" for n in self.notes + self.flag_notes()]
        return "\n".join(lines).rstrip() + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        header = ["approach"]
        for col in self.columns:
            header += [col, f"{col} (paper)", f"{col} (spread)"]
        writer.writerow(header)
        for label, cells in self.rows:
            row: list[str] = [self.label(label, cells)]
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
        lines += [self.label(esc(label), cells, "\\textsuperscript{!}") + " & "
                  + " & ".join(esc(c.text()).replace("±", "$\\pm$") for c in cells) + " \\\\"
                  for label, cells in self.rows]
        lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
        return "\n".join(lines) + "\n"
