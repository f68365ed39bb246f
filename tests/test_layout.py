"""The code's layout (docs/pipeline.md, "The code's layout"): no package of src/caprl imports one
that imports it back, and no two modules import each other, counting imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def modules() -> dict[str, Path]:
    """Every module of caprl by dotted name (a package by its own name: its __init__.py)."""
    out = {}
    for path in sorted((SRC / "caprl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The caprl modules ``path`` imports anywhere in it (``from a import b``: a.b where b is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "caprl"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "caprl" and not node.level:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names}
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def package(name: str) -> str:
    """The top-level part of caprl a module belongs to (caprl.features.base -> features)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "caprl"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other() -> None:
    assert cycles(graph()) == []


def test_the_packages_form_layers() -> None:
    """Between packages the imports run one way only (the package-level graph has no cycle)."""
    edges: dict[str, set[str]] = {}
    for source, targets in graph().items():
        edges.setdefault(package(source), set()).update(package(t) for t in targets if package(t) != package(source))
    edges.pop("caprl", None)  # caprl/__init__.py and __main__.py: the entry points
    assert cycles(edges) == []


def test_the_top_level_holds_at_most_eight_modules() -> None:
    assert len([p for p in (SRC / "caprl").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]) <= 8
