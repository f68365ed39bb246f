"""The claims the DAG resolved, published (``caprl claims-summary``, the targets ``claims_<paper>``
and ``all_claims``): each paper's ``claims/<paper>/verdicts.{json,md,png}`` copied to
``results/claims/<paper>.{json,md,png}`` (and ``_tables.md``), then every paper's claims found there in one page,
``results/claims/summary.md``, and with ``--readme`` the same between README.md's claims markers."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from caprl import io
from caprl.claims.verdicts import summary_markdown
from caprl.errors import CaprlError

README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"


def update_readme(readme: Path, summary: str) -> None:
    """Copy the summary between the claims markers of the README."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise CaprlError(f"{readme} has no {README_START} ... {README_END} block")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    io.write_text(readme, f"{head}{README_START}\n{summary}{README_END}{tail}")


def publish(verdicts: list[Path], out: Path) -> None:
    """Copy each paper's verdicts json, page, forest plot, tables over the seeds and aggregate into
    ``out`` as ``<paper>.{json,md,png}``, ``<paper>_tables.md`` and ``<paper>_aggregate.png``."""
    for path in verdicts:
        paper = io.read_json(path, "a paper's claims verdicts")["paper"]
        for suffix in (".json", ".md", ".png", "_tables.md", "_aggregate.png"):
            with io.atomic_path(out / f"{paper}{suffix}") as tmp:
                shutil.copyfile(path.with_name(path.stem + suffix), tmp)


def summary(out: Path, readme: Path | None = None) -> str:
    """Write ``<out>/summary.md`` (and the README's copy); its text."""
    text = summary_markdown(out)
    io.write_text(out / "summary.md", text)
    if readme is not None:
        update_readme(readme, text)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publish", nargs="*", default=[], type=Path, metavar="VERDICTS",
                        help="papers' claims/<paper>/verdicts.json to copy into --out first")
    parser.add_argument("--out", default=Path("results/claims"), type=Path, help="the papers' <paper>.json")
    parser.add_argument("--readme", default=None, type=Path, help="also copy the summary into this README")


def main(args: argparse.Namespace) -> None:
    publish(args.publish, args.out)
    summary(args.out, args.readme)
