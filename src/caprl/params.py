"""params.yaml: the single source of parameters, validated against one JSON Schema.

The schema lives in ``workflow/schemas/params.schema.yaml`` beside the params file (the
same file Snakemake's ``validate`` uses), so every stage checks exactly what the DAG checks.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import yaml

from caprl import io
from caprl.errors import CaprlError
from caprl.run_points import LISTED_ONLY, SWEPT_FROM, expand_sweeps, expand_tuning, named, unknown_run

SCHEMA_RELPATH = Path("workflow") / "schemas" / "params.schema.yaml"
BOTTOMUP = "bottomup"  # the backbone whose features come from bottom-up-attention's TSVs (caprl bottomup)


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


def _schema(path: Path) -> dict[str, Any]:
    """The schema, read once per process and file version (a job validates its params more than once)."""
    stat = path.stat()
    return _read_schema(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_schema(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506


def validate(params: dict[str, Any], schema_path: Path, source: str = "params.yaml") -> None:
    """Raise CaprlError naming the first offending key (unknown keys and wrong types included)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema(schema_path))
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [format_error(e, source) for e in errors[:5]]
        raise CaprlError("invalid parameters:\n  " + "\n  ".join(lines))


#: one params file, or several layered in order (params.yaml, then a recipe: ``--params A B``)
ParamsFiles = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


def merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` laid over ``base``: mappings merge key by key, any other value replaces.

    The semantics of Snakemake's ``--configfile`` (``snakemake.utils.update_config``), so that
    ``snakemake --configfile R.yaml`` and ``caprl <stage> --params params.yaml R.yaml`` see the
    same parameters. ``base`` is not modified.
    """
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as params files are written: PyYAML's YAML 1.1 reads ``1e-08`` (no dot, as JSON and
    Python print small numbers) as a string; here it is the float YAML 1.2 and every reader means.
    libyaml's parser where PyYAML has it (the same documents, ~6x faster: every job reads params)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _read_one(p: Path) -> dict[str, Any]:
    if not p.exists():
        raise CaprlError(f"params file not found: {p} (run from the repository root or pass --params)")
    try:
        data = yaml.load(io.read_text(p, "params file"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise CaprlError(f"{p}:{line} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CaprlError(f"{p}: expected a mapping of sections at the top level")
    return data


def files_of(paths: ParamsFiles) -> list[Path]:
    """The params files of ``paths`` in layering order (a single path is a list of one)."""
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def read(paths: ParamsFiles) -> dict[str, Any]:
    """The raw parameters of one file or of several laid over each other (:func:`merge`), unchecked."""
    files = files_of(paths)
    if not files:
        raise CaprlError("no params file given (pass --params params.yaml)")
    params: dict[str, Any] = {}
    for p in files:
        params = merge(params, _read_one(p))
    return params


def load(paths: ParamsFiles = "params.yaml") -> dict[str, Any]:
    """Load and validate params.yaml (and any recipe laid over it); errors name the file, line or key."""
    files = files_of(paths)
    params = read(files)
    source = " + ".join(str(p) for p in files)
    validate(params, find_schema(files[0]), source=source)
    params = resolve(params)
    check(params)
    return params


def resolve(params: dict[str, Any]) -> dict[str, Any]:
    """A validated params dict as every stage reads it: the objectives' shared defaults filled in,
    one run per sweep point and per tuning point (idempotent)."""
    return expand_tuning(expand_sweeps(with_objective_defaults(params)))


def with_objective_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """Every ``objectives.<method>`` over ``objective_defaults`` (the options every method shares),
    so that a method, a run and a recipe see one resolved set of options."""
    shared = params.get("objective_defaults", {})
    return {**params, "objectives": {method: {**shared, **options}
                                     for method, options in params["objectives"].items()}}


def tuning_datasets(params: dict[str, Any], run: str) -> list[str]:
    """Where ``run``'s tuning points train: its datasets, as if it were not ``listed_only`` (a point
    is trained wherever its run could be; :func:`expand_tuning` drops the flag from points)."""
    return run_spec({**params, "runs": {**params["runs"], run: named(params["runs"][run])}}, run).datasets


# -- what the schema cannot say: names that refer to other sections -------------------------

def check(params: dict[str, Any]) -> None:
    """Cross-references between sections (run -> method/model/init/datasets, objective -> reward);
    CaprlError naming the key. Run by :func:`load` and by the workflow plan (which also checks each
    dataset against its reader: :func:`caprl.data.readers.check_datasets`)."""
    if not enabled_datasets(params):
        raise CaprlError("datasets: no dataset has enabled: true; enable at least one")
    for name in enabled_datasets(params):
        unknown = [run for run in params["datasets"][name].get("runs", []) if run not in params["runs"]]
        if unknown:
            raise CaprlError(f"datasets.{name}.runs: '{unknown[0]}' is not a run under runs: "
                             f"({', '.join(params['runs'])})")
    for method, options in params["objectives"].items():
        _check_reward(params, options, f"objectives.{method}.reward")
    for run in params["runs"]:
        spec = run_spec(params, run)
        _check_reward(params, spec.options, f"runs.{run}.options.reward")
        for role, source in spec.init.items():
            if source not in params["runs"]:
                raise CaprlError(f"runs.{spec.source}.init.{role}: {unknown_run(params, source)}")
        _check_no_cycle(params, run)
        for role, source in spec.init.items():
            missing = [ds for ds in spec.datasets if ds not in run_spec(params, source).datasets]
            if missing:
                raise CaprlError(f"runs.{run}.init.{role}: run '{source}' does not train on {', '.join(missing)} "
                                 f"(set runs.{source}.datasets or runs.{run}.datasets, or list {source} "
                                 f"under datasets.{missing[0]}.runs)")


def _check_reward(params: dict[str, Any], options: dict[str, Any], key: str) -> None:
    reward = options.get("reward")
    if reward is not None and reward not in params["rewards"]:
        raise CaprlError(f"{key}: '{reward}' is not a reward under rewards: ({', '.join(params['rewards'])})")


def _check_no_cycle(params: dict[str, Any], run: str, path: tuple[str, ...] = ()) -> None:
    """A run must not start, through its ``init`` runs, from itself."""
    if run in path:
        raise CaprlError(f"runs.{path[0]}.init: the runs start from each other: {' -> '.join(path + (run,))}")
    for source in params["runs"].get(run, {}).get("init", {}).values():
        _check_no_cycle(params, source, path + (run,))


# -- typed views of one section entry ----------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One entry of ``runs:``, resolved.

    ``options``: ``objectives.<method>`` with the run's ``options`` on top; ``init``: role ->
    the run whose best checkpoint that module starts from; ``datasets``: the enabled datasets
    it trains on (its ``datasets:`` or every enabled dataset; ``listed_only``: those whose ``runs:`` lists it).
    """

    name: str
    method: str
    model: str
    options: dict[str, Any]
    init: dict[str, str] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    decode: dict[str, Any] = field(default_factory=dict)  # evaluation's decoding: decode: + the run's own
    source: str = ""  # the params.yaml entry: the run itself, or the swept run this is a point of



def run_spec(params: dict[str, Any], run: str) -> RunSpec:
    """The resolved spec of ``runs.<run>``; CaprlError naming the key for a bad reference."""
    runs = params["runs"]
    if run not in runs:
        raise CaprlError(f"unknown run '{run}': params.yaml runs: defines {', '.join(runs) or 'none'}")
    entry = runs[run]
    method, model = entry["method"], entry["model"]
    if method not in params["objectives"]:
        raise CaprlError(f"runs.{run}.method: '{method}' is not under objectives: "
                         f"({', '.join(params['objectives'])})")
    if model not in params["models"]:
        raise CaprlError(f"runs.{run}.model: '{model}' is not under models: ({', '.join(params['models'])})")
    defaults = params["objectives"][method]
    overrides = entry.get("options", {})
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise CaprlError(f"runs.{run}.options.{unknown[0]}: objectives.{method} has no option '{unknown[0]}' "
                         f"(its options: {', '.join(defaults)})")
    listed = entry.get("datasets")
    if listed is None:
        datasets = enabled_datasets(params)
    else:
        for ds in listed:
            if ds not in params["datasets"]:
                raise CaprlError(f"runs.{run}.datasets: no dataset named '{ds}' under datasets: "
                                 f"({', '.join(params['datasets'])})")
        datasets = [ds for ds in listed if params["datasets"][ds]["enabled"]]
    default = () if entry.get(LISTED_ONLY) else params["runs"]  # listed_only: where runs: lists it
    datasets = [ds for ds in datasets if run in params["datasets"][ds].get("runs", default)]
    return RunSpec(name=run, method=method, model=model, options={**defaults, **overrides},
                   init=dict(entry.get("init", {})), datasets=datasets,
                   decode={**params["decode"], **entry.get("decode", {})}, source=entry.get(SWEPT_FROM, run))


def enabled_datasets(params: dict[str, Any]) -> list[str]:
    """The datasets the DAG builds, in params.yaml order."""
    return [name for name, spec in params["datasets"].items() if spec["enabled"]]


def dataset_tables(params: dict[str, Any], dataset: str) -> list[str]:
    """The tables built for ``dataset``: its own ``tables:`` or the top-level list."""
    return list(params["datasets"][dataset].get("tables", params["tables"]))


def dataset_spec(params: dict[str, Any], name: str) -> dict[str, Any]:
    """``datasets.<name>`` with ``name`` added and ``synthetic`` = the generator settings it uses
    (the ``synthetic:`` section with the dataset's own overrides on top)."""
    datasets = params["datasets"]
    if name not in datasets:
        raise CaprlError(f"datasets.{name}: no such dataset in params.yaml (datasets: {', '.join(datasets)})")
    spec = dict(datasets[name])
    spec["synthetic"] = {**params["synthetic"], **spec.get("synthetic", {})}
    spec["name"] = name
    return spec


def dataset_features(params: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``features:`` section as dataset ``name`` uses it: its ``backbone``, and ``video`` with the
    dataset's own ``datasets.<name>.video`` overrides on top (e.g. the built-in video set's segments)."""
    spec = dataset_spec(params, name)
    features = dict(params["features"])
    features["backbone"] = spec["backbone"]
    features["video"] = {**features.get("video", {}), **spec.get("video", {})}
    return features


def dataset_vocab(params: dict[str, Any], name: str) -> dict[str, Any]:
    """The vocabulary settings of dataset ``name``: the ``vocab:`` section (``min_count``,
    ``max_length``) with the dataset's own ``datasets.<name>.vocab`` overrides on top."""
    datasets = params["datasets"]
    if name not in datasets:
        raise CaprlError(f"datasets.{name}: no such dataset in params.yaml (datasets: {', '.join(datasets)})")
    return {**params["vocab"], **datasets[name].get("vocab", {})}
