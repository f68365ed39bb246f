"""Typed checkpoints, shared by training, evaluation and figures.

A :class:`Checkpoint` holds every trainable module of a run (the caption model under
``"model"``, and an objective's own modules: a baseline, a value network, a listener)
each with the architecture and options that rebuild it, the vocabulary's hash, the hash of
the configuration that made it, the code version, and — for the resume state — the
position in the data, the optimiser and the RNG states (CPU and CUDA) of every process.

On disk it is a dict of tensors and plain Python containers only, so it loads with
``torch.load(..., weights_only=True)``; :func:`load` refuses a different vocabulary, and reads a
caption model written before its architecture gained an option (:data:`LATER_OPTIONS`) as the model
it was trained with. :func:`load_weights` starts a run's module from a record, refusing another
architecture or other sizes in words that name the run and the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from caprl.errors import CaprlError, WriteError
from caprl.io import atomic_path, guess_write_errno, left_as_it_was, write_cause
from caprl.models import MODELS, CaptionModel, build_model, compat

FORMAT = 2  # version of the on-disk layout below
MODEL = "model"  # role of the caption model
#: options a caption model's architecture gained after checkpoints of this format were written
#: without them: arch -> option -> (the value every such older checkpoint was trained with, a weight
#: only that value's model has, checked before it is assumed). fc's cell came in 0478804: before it
#: Show-Tell's recurrence was torch's LSTMCell (cell: lstm; benchmarks/README.md, "SCST against
#: self-critical.pytorch's own trainer"), whatever the cell params.yaml names now.
LATER_OPTIONS: dict[str, dict[str, tuple[Any, str]]] = {"fc": {"cell": ("lstm", "lstm.weight_ih")}}


@dataclass
class ModuleRecord:
    """One trainable module: ``arch`` + ``options`` rebuild it, ``state`` holds its weights.

    For the caption model ``arch`` is a ``caprl.models`` registry key and ``shape`` holds
    vocab_size / feat_dim / n_regions; an objective's module has ``arch`` = "<method>.<name>"
    and is rebuilt by its objective from ``options``.
    """

    arch: str
    options: dict[str, Any]
    state: dict[str, torch.Tensor]
    shape: dict[str, int] = field(default_factory=dict)


@dataclass
class Checkpoint:
    run: dict[str, Any]
    modules: dict[str, ModuleRecord]
    vocab_sha256: str
    config_hash: str = ""
    code_version: str = ""
    position: dict[str, Any] = field(default_factory=dict)  # epoch, batch, step, best_score, history, ...
    optimizer: dict[str, Any] | None = None
    rng: dict[str, list[Any]] | None = None  # {"cpu": [per process], "cuda": [per process]}
    mlflow_run_id: str = ""
    made_from: dict[str, Any] = field(default_factory=dict)  # its data's record (caprl.io.provenance); {}: older

    def to_payload(self) -> dict[str, Any]:
        payload = dataclasses.asdict(self)
        payload["format"] = FORMAT
        return payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any], where: str = "checkpoint") -> "Checkpoint":
        if payload.get("format") != FORMAT:
            raise CaprlError(f"{where}: checkpoint format {payload.get('format')!r}, this caprl reads {FORMAT}: "
                             "retrain the run (delete its runs/<dataset>/<run>/ folder)")
        modules = {name: _with_later_options(ModuleRecord(**record), name, where)
                   for name, record in payload["modules"].items()}
        fields = {f.name for f in dataclasses.fields(cls)} - {"modules"}
        return cls(modules=modules, **{k: v for k, v in payload.items() if k in fields})

    def module(self, role: str, where: str = "checkpoint") -> ModuleRecord:
        if role not in self.modules:
            raise CaprlError(f"{where} holds no module '{role}' (it holds {', '.join(sorted(self.modules))})")
        return self.modules[role]


def _with_later_options(record: ModuleRecord, role: str, where: str) -> ModuleRecord:
    """``record`` with each of :data:`LATER_OPTIONS` it lacks (written before its architecture had
    the option) set to the value it was trained with; refused where its weights are not that value's."""
    for option, (value, weight) in LATER_OPTIONS.get(record.arch, {}).items():
        if option in record.options:
            continue
        if weight not in record.state:
            raise CaprlError(f"{where}: its {role} ({record.arch}) records no '{option}' option, so it was written "
                             f"before caprl had one, when every {record.arch} was built with {option}: {value}; but "
                             f"its weights are not that model's (no '{weight}'): retrain the run (delete its "
                             "runs/<dataset>/<run>/ folder)")
        record.options = {**record.options, option: value}
    return record


def record_of(module: torch.nn.Module, arch: str, options: dict[str, Any],
              shape: dict[str, int] | None = None) -> ModuleRecord:
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}  # saved at once: no copy needed
    return ModuleRecord(arch=arch, options=dict(options), state=state, shape=dict(shape or {}))


def model_record(model: CaptionModel, arch: str) -> ModuleRecord:
    shape = {"vocab_size": model.vocab_size, "feat_dim": model.feat_dim, "n_regions": model.n_regions}
    return record_of(model, arch, dataclasses.asdict(model.config), shape)


def save_payload(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write atomically: a job killed mid-save, or a save that fails, leaves the previous file intact.

    A failed write is a :class:`WriteError` naming ``path`` and the cause. torch's zip writer
    reports one as ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``; it
    writes through a Python file here, so the ``OSError`` behind that is kept (as its context)
    and names the cause; were it lost, the cause is guessed from the file-size limit and the
    free space (:func:`caprl.io.guess_write_errno`).
    """
    with atomic_path(path) as tmp:
        try:
            with open(tmp, "wb") as fh:
                torch.save(payload, fh)
        except RuntimeError as exc:
            if write_cause(exc) is not None or not _ZIP_WRITE_FAILED.search(str(exc)):
                raise  # atomic_path names the cause; or not a failed write
            detail = f"{left_as_it_was(Path(path))}; torch: {exc}"
            raise WriteError(path, guess_write_errno(tmp), detail=detail) from exc


_ZIP_WRITE_FAILED = re.compile(r"inline_container|PytorchStreamWriter|unexpected pos|iostream error")


def load_payload(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"checkpoint not found: {p}")
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated/foreign files
        raise CaprlError(f"{p}: not a readable caprl checkpoint ({type(exc).__name__}: {exc})") from exc


def _header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's payload memory-mapped (its tensors are not read): for its small fields."""
    try:
        return torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises several types for truncated/foreign files
        raise CaprlError(f"{path}: not a readable caprl checkpoint ({type(exc).__name__}: {exc})") from exc


def mlflow_run_id(path: str | os.PathLike[str]) -> str:
    """The MLflow run of the training job that wrote the checkpoint ("" for none), read without
    loading its tensors: evaluation and training jobs link their runs to it."""
    return str(_header(path).get("mlflow_run_id") or "")


def resumable_run_id(path: str | os.PathLike[str], config_hash: str) -> str:
    """The MLflow run to go on logging into when a training job restarts from ``path`` (its
    ``last.pt``): the checkpoint's run where it was written with these parameters (``config_hash``),
    else "" (a run whose parameters changed starts afresh, so it gets a new MLflow run: MLflow
    refuses to change a run's logged parameters). An unreadable file gives "" too (the trainer says why)."""
    try:
        payload = _header(path)
    except CaprlError:
        return ""
    if str(payload.get("config_hash") or "") != config_hash:
        return ""
    return str(payload.get("mlflow_run_id") or "")


def save(path: str | os.PathLike[str], checkpoint: Checkpoint) -> None:
    save_payload(path, checkpoint.to_payload())


def load(path: str | os.PathLike[str], vocab_sha256: str | None = None) -> Checkpoint:
    """Read a checkpoint; with ``vocab_sha256``, refuse one trained on another vocabulary."""
    ckpt = Checkpoint.from_payload(load_payload(path), where=str(path))
    if vocab_sha256 is not None and ckpt.vocab_sha256 != vocab_sha256:
        raise CaprlError(
            f"{path} was trained with a different vocabulary (sha256 {ckpt.vocab_sha256[:12]}..., "
            f"expected {vocab_sha256[:12]}...): retrain it, or use the vocabulary it was trained with"
        )
    return ckpt


def model_from_checkpoint(ckpt: Checkpoint, role: str = MODEL) -> CaptionModel:
    """Rebuild the caption model from the config stored in the checkpoint and load its weights."""
    record = ckpt.module(role)
    model = build_model(record.arch, dict(record.options), vocab_size=int(record.shape["vocab_size"]),
                        feat_dim=int(record.shape["feat_dim"]), n_regions=int(record.shape["n_regions"]),
                        where="checkpoint")
    model.load_state_dict(record.state)
    return model


def arch_of(model: CaptionModel) -> str:
    """The ``caprl.models`` registry key of ``model``'s class ("" for a class registered under none)."""
    return next((name for name, cls in MODELS.items() if type(model) is cls), "")


def load_weights(module: torch.nn.Module, record: ModuleRecord, path: str | os.PathLike[str], run: str, role: str,
                 source: str) -> None:
    """Start run ``run``'s ``role`` module from ``record`` (that role of checkpoint ``path``, written by
    run ``source``). A caption model of another architecture (:func:`caprl.models.compat.init_arch_problem`,
    the plan's words) and weights whose names or shapes are not the module's are refused, naming the
    run, the file and what differs, never with torch's ``size mismatch``."""
    arch = arch_of(module) if isinstance(module, CaptionModel) else record.arch
    if role == MODEL and arch:
        problem = compat.init_arch_problem(run, role, source, record.arch, arch)
        if problem is not None:
            raise CaprlError(f"{path}: {problem}")
    try:
        module.load_state_dict(record.state)
    except RuntimeError as exc:  # torch's missing / unexpected keys, size mismatch
        differs = _differences(record, module)
        if not differs:
            raise
        raise CaprlError(f"{path}: runs.{run}.init.{role}: the {record.arch} {role} of run {source} does not fit run "
                         f"{run}'s ({differs}); give run {run}'s {role} the options of run {source}'s, or drop "
                         f"init.{role} to train it from scratch") from exc


def _differences(record: ModuleRecord, module: torch.nn.Module) -> str:
    """What differs between ``record`` and ``module``: options (caption models), then weights' shapes and names."""
    config = getattr(module, "config", None)
    mine = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    parts = [f"{key} {record.options.get(key)!r} there, {value!r} here" for key, value in mine.items()
             if record.options.get(key) != value]
    want = module.state_dict()
    parts += [f"{key} {list(record.state[key].shape)} there, {list(value.shape)} here" for key, value in want.items()
              if key in record.state and record.state[key].shape != value.shape][:3]
    missing, extra = [k for k in want if k not in record.state], [k for k in record.state if k not in want]
    parts += [f"{what} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
              for what, keys in (("no weight", missing), ("unknown weight", extra)) if keys]
    return "; ".join(parts)


@lru_cache(maxsize=1)
def code_version() -> str:
    """``git describe`` of the source tree (commit, ``-dirty`` if modified), or the package version."""
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=root,
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import version

    return f"caprl {version('caprl')}"
