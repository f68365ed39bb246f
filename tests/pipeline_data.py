"""A tiny real dataset, made by the real ``caprl`` stages, for tests that need one.

``build_dataset(workdir, params)`` writes ``workdir/params.yaml`` and runs, in ``workdir``,
the commands the workflow runs (``snakemake -n -p --forceall all_tables`` prints them;
workflow/rules/data.smk and features.smk hold them): synthesize, prepare, vocab, features
for every shard (concurrently, as Snakemake would on 2 cores), merge-features, cider-df and
optionally references, for one dataset of params.yaml. Output paths follow
caprl.workflow.plan (as the Snakefile), relative to ``workdir``. It returns the absolute
paths, ready to pass to ``caprl train``/``evaluate`` (with ``--dataset``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml


@dataclass(frozen=True)
class DatasetPaths:
    workdir: Path
    params: Path
    annotations: Path
    vocab: Path
    labels: Path
    features: Path
    cider_df: Path
    references: dict[str, Path] = field(default_factory=dict)  # split -> COCO-format references

    def train_args(self) -> list[str]:
        """The data arguments of ``caprl train`` (as the workflow's train rule passes them)."""
        return ["--annotations", str(self.annotations), "--vocab", str(self.vocab), "--labels", str(self.labels),
                "--features", str(self.features), "--cider-df", str(self.cider_df)]


def caprl_command(stage: str, params: Path, *args: str | os.PathLike[str]) -> list[str]:
    """``python -m caprl STAGE --params PARAMS ARGS...`` with this interpreter."""
    return [sys.executable, "-m", "caprl", stage, "--params", str(params), *map(str, args)]


def _check(proc: subprocess.CompletedProcess[str] | subprocess.Popen[str], cmd: list[str], output: str) -> None:
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[2:])} failed with exit code {proc.returncode}:\n{output[-6000:]}")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None, timeout: float) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    _check(proc, cmd, proc.stdout + proc.stderr)


def build_dataset(workdir: Path, params: dict[str, Any], references: Sequence[str] = (),
                  env: dict[str, str] | None = None, timeout: float = 300, dataset: str | None = None) -> DatasetPaths:
    """Write ``workdir/params.yaml`` and make one dataset of ``params`` through the real CLI.

    ``params`` must be a complete, valid params.yaml (e.g. ``merge(default_params(), TINY)``);
    ``dataset``: a name under ``datasets:`` (default: the first enabled one); unless it is
    generated, its ``raw`` and ``media_root`` must exist.
    ``references``: splits whose COCO-format references to write too (as the evaluate rules use).
    """
    from caprl.params import dataset_spec, enabled_datasets
    from caprl.workflow.plan import Dataset

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    params_path = workdir / "params.yaml"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    name = dataset or enabled_datasets(params)[0]
    spec = dataset_spec(params, name)
    ds = Dataset(name, spec["format"], spec["raw"], spec["media_root"], spec["generate"], spec["backbone"])
    raw_json, image_root = ds.raw, ds.media_root
    paths = DatasetPaths(
        workdir=workdir, params=params_path,
        annotations=workdir / ds.annotations, vocab=workdir / ds.vocab, labels=workdir / ds.labels,
        features=workdir / ds.features, cider_df=workdir / ds.cider_df,
        references={split: workdir / ds.refs(split) for split in references},
    )
    logs = Path("logs") / name
    backbone, shard_dir = ds.backbone, Path(ds.shard_dir)

    def cmd(stage: str, log: str, *args: str | os.PathLike[str]) -> list[str]:
        return caprl_command(stage, params_path, "--log", logs / log, *args)

    def run(stage: str, log: str, *args: str | os.PathLike[str]) -> None:
        _run(cmd(stage, log, *args), workdir, env, timeout)

    if ds.generate:
        run("synthesize", "synthesize.log", "--dataset", name, "--out-json", raw_json, "--image-dir", image_root)
    run("prepare", "prepare.log", "--dataset", name, "--raw", raw_json, "--media-root", image_root,
        "--out", paths.annotations)
    run("vocab", "vocab.log", "--annotations", paths.annotations, "--out-vocab", paths.vocab,
        "--out-labels", paths.labels)
    shard_cmds = [cmd("features", f"features_{backbone}_{shard}.log", "--dataset", name, "--annotations", paths.annotations,
                      "--image-root", image_root, "--shard", str(shard), "--out", shard_dir / f"shard{shard}.h5")
                  for shard in params["features"]["shards"]]
    jobs = [(c, subprocess.Popen(c, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)) for c in shard_cmds]
    for c, job in jobs:
        output, _ = job.communicate(timeout=timeout)
        _check(job, c, output)
    run("merge-features", f"merge_features_{backbone}.log", "--annotations", paths.annotations,
        "--shard-dir", shard_dir, "--out", paths.features)
    run("cider-df", "cider_df.log", "--annotations", paths.annotations, "--split", "train", "--out", paths.cider_df)
    for split, out in paths.references.items():
        run("references", f"references_{split}.log", "--annotations", paths.annotations, "--split", split,
            "--out", out)
    return paths


def tiny_files(tmp_path: Path, n_test: int = 3, image_size: int = 32) -> dict[str, Path]:
    """A generated dataset's files made in this process (no CLI): ``annotations.json``,
    ``vocab.json`` (every word), ``labels.h5`` and 16-d patch ``features.h5`` under ``tmp_path``."""
    from caprl import io
    from caprl.data import karpathy, synthetic
    from caprl.data.vocab import build_vocab, encode_labels, write_labels
    from caprl.features.backbones import PatchesBackbone
    from caprl.features.extract import extract_features

    cfg = {"n_train": 6, "n_val": 2, "n_test": n_test, "image_size": image_size, "max_objects": 2}
    synthetic.write_dataset(synthetic.generate(cfg, 0), 11, tmp_path / "d.json", tmp_path / "images")
    annotations = karpathy.prepare_annotations(karpathy.read_karpathy(tmp_path / "d.json", "synthetic"), "synthetic")
    paths = {name: tmp_path / name for name in ("annotations.json", "vocab.json", "labels.h5", "features.h5")}
    io.write_json(paths["annotations.json"], annotations)
    vocab = build_vocab(annotations, 1, 16)
    write_labels(paths["labels.h5"], encode_labels(annotations, vocab), vocab)
    io.write_json(paths["vocab.json"], vocab.to_json())
    extract_features(annotations["images"], tmp_path / "images", PatchesBackbone(grid=4, cell_size=4),
                     paths["features.h5"], 16)
    return paths
