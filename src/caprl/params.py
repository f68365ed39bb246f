"""params.yaml: the single source of parameters, validated against one JSON Schema.

The schema lives in ``workflow/schemas/params.schema.yaml`` beside the params file (the
same file Snakemake's ``validate`` uses), so every stage checks exactly what the DAG checks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from caprl.errors import CaprlError

SCHEMA_RELPATH = Path("workflow") / "schemas" / "params.schema.yaml"


def find_schema(params_path: Path) -> Path:
    """The schema beside the params file, or ``$CAPRL_PARAMS_SCHEMA``."""
    env = os.environ.get("CAPRL_PARAMS_SCHEMA")
    if env:
        return Path(env)
    for base in (params_path.resolve().parent, Path.cwd()):
        candidate = base / SCHEMA_RELPATH
        if candidate.exists():
            return candidate
    raise CaprlError(
        f"cannot find {SCHEMA_RELPATH} beside {params_path}; run caprl from the repository root "
        "or set CAPRL_PARAMS_SCHEMA"
    )


def _key_path(error: Any) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def format_error(error: Any, source: str) -> str:
    """One line naming the offending key, for any jsonschema ValidationError."""
    where = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - allowed)
        keys = ", ".join(f"{where}.{k}" if where != "<top level>" else k for k in unknown)
        return f"{source}: unknown key(s) {keys}; allowed here: {', '.join(sorted(allowed))}"
    if error.validator == "required":
        return f"{source}: key '{where}': {error.message}"
    return f"{source}: key '{where}': {error.message}"


def validate(params: dict[str, Any], schema_path: Path, source: str = "params.yaml") -> None:
    """Raise CaprlError naming the first offending key (unknown keys and wrong types included)."""
    import jsonschema

    schema = yaml.safe_load(schema_path.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [format_error(e, source) for e in errors[:5]]
        raise CaprlError("invalid parameters:\n  " + "\n  ".join(lines))


def load(path: str | os.PathLike[str] = "params.yaml") -> dict[str, Any]:
    """Load and validate params.yaml; errors name the file, line or key."""
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"params file not found: {p} (run from the repository root or pass --params)")
    try:
        params = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise CaprlError(f"{p}:{line} is not valid YAML: {exc}") from exc
    if not isinstance(params, dict):
        raise CaprlError(f"{p}: expected a mapping of sections at the top level")
    validate(params, find_schema(p), source=str(p))
    return params


RUN_KEYS = ("model", "objective", "init")


def run_spec(params: dict[str, Any], run: str) -> dict[str, Any]:
    """The settings of one training run: ``{'name', 'model', 'objective', 'init', 'options'}``.

    ``options`` are the objective's options from ``objectives.<objective>`` with the run's
    own overrides (any other key of its ``runs`` entry, e.g. ``epochs``) on top.
    """
    runs = params["runs"]
    if run in runs["xe"]:
        entry = {"objective": "xe", "init": None, **runs["xe"][run]}
    elif run in runs["rl"]:
        entry = dict(runs["rl"][run])
    else:
        entry = None
    if entry is not None:
        overrides = {k: v for k, v in entry.items() if k not in RUN_KEYS}
        options = {**params["objectives"].get(entry["objective"], {}), **overrides}
        return {"name": run, "model": entry["model"], "objective": entry["objective"], "init": entry["init"],
                "options": options}
    known = sorted(runs["xe"]) + sorted(runs["rl"])
    raise CaprlError(f"unknown run '{run}': params.yaml runs.xe / runs.rl define {', '.join(known)}")
