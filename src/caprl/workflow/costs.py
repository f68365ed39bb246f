"""Every job of the workflow plan with its estimated hours and peak memory (``caprl plan``,
which :mod:`caprl.workflow.plan_report` prints).

Jobs are :func:`caprl.workflow.plan.build_plan`'s (the Snakefile's), named as Snakemake's rules:
``train coco/topdown-scst``. The estimate is a pure function of the params, ``step_costs.yaml``
(the measured figures, each with its source) and any ``data/<ds>/annotations.json`` /
``vocab.json`` already made; nothing is timed at plan time. The rules:

* **Sizes:** ``data/<ds>/annotations.json`` where made, else the generator's (``synthetic:``), else
  step_costs.yaml's: COCO Karpathy 113,287 / 5,000 / 5,000, Flickr30k 29,000 / 1,014 / 1,000, TGIF
  80,000 / 10,708 / 11,360 (paper 002's official split [15], per split as the TGIF release).
* **Steps.** A run takes ``epochs x ceil(n_train / train.batch_size)`` optimiser steps (an epoch
  is one pass over the training IMAGES, ``Trainer.fit``: gold captions and samples per image are
  in the step's time, not its count), one update per turn of a multi-turn objective; early
  stopping is ignored (an upper bound). With ``train.gpus`` = g each process steps on batch / g.
* **Per-step time** = the measured ms of the method's family (xe, scst, sll_sle) and the
  architecture's measured look-alike (fc, topdown) at that batch, on the device, times:
  the architecture's factor; the method's work per image over the family's at the reference
  (decode passes of one caption: XE 3 per gold caption, SCST 1 + 3 per sample, ...: the
  ``methods:`` table); for attention models 1 + k (R / 36 - 1) for R regions (k measured); and
  ``(hidden / 512) ** 2`` (quadratic in the hidden size, :func:`model_hidden`: the transformer's
  d_model; on the GPU at least 1: the measured
  H100 steps are bound by kernel launches, not arithmetic, so a smaller model is no faster).
  Between measured batches the time is linear in the batch, beyond them linear along the two
  outermost points. With no H100 figure: the CPU figure at batch 50 over the CPU / H100 ratio of
  SCST Top-Down (2339 / 96 = 24.4), along SCST Top-Down's H100 batch curve: "scaled from CPU".
  A method or architecture missing from the table is costed as ``fallback_method`` /
  ``fallback_arch`` says (SCST, Top-Down) and its basis says "fallback".
* **Validation and evaluation.** One decode unit (one caption of one image, forward only) costs
  a sixteenth of an SCST step per image (1 greedy + 5 samples x 3 passes), at
  ``evaluate.batch_size``. Every epoch decodes the val split greedily (runs with ``init``: once
  more, for the start); evaluation decodes the split with the run's beam (k units), plus the
  greedy captions, the diversity sets and lookahead where params ask for them. Metric scoring
  (Java, CPU) is not counted. Retrieval: one unit per image.
* **Features:** all images (GIFs: x frames) / shards x ms per image of the backbone (on the GPU
  scaled from CPU as above: an upper bound, a CNN gains more than 24x on a GPU).
* **Memory** (estimates): CPU: the measured peak RSS, linear in the batch; the part that grows
  with it (activations ~ batch x rows x length x hidden) scaled by hidden / 512 and the work per
  image. GPU: parameters with gradient and Adam (16 bytes each; the count from the sizes, the
  vocabulary and the feature size) + that same activation part + ``gpu_context_mib``. Decoding
  keeps no graph: its activations are one word's of the L = 16 (and 4 bytes per parameter).
Jobs that need no GPU (data preparation, tables, figures) are listed but not costed.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from caprl import io, params as params_mod
from caprl.data import grammar, synthetic_video
from caprl.errors import CaprlError
from caprl.workflow.plan import ANNOTATIONS, CPU_BACKBONES, VOCAB, Dataset, Plan, TrainJob, build_plan

log = logging.getLogger(__name__)

COSTS = Path(__file__).with_name("step_costs.yaml")
DEVICES = ("h100", "h200", "cpu")
RULE_ORDER = ("synthesize", "synthesize_video", "prepare", "vocab", "references", "cider_df", "features",
              "bottomup_features", "merge_features", "train", "evaluate", "retrieval", "gold_retrieval", "baseline",
              "attention_figure", "psst_figures", "curves", "tables", "tune_report")
NOT_COSTED = "no GPU: not costed"


def load_costs(path: Path = COSTS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def interp(points: dict[int, float], x: float) -> float:
    """Piecewise linear through ``points`` (batch -> value), extended along the outermost two."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]] * x / xs[0]
    lo, hi = (xs[0], xs[1]) if x <= xs[0] else (xs[-2], xs[-1])
    for a, b in zip(xs, xs[1:]):
        if a <= x <= b:
            lo, hi = a, b
    return max(points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo), 1e-3)


@dataclass(frozen=True)
class Sizes:
    """Images per split, gold captions per training image, vocabulary size, and where they come from."""

    train: int
    val: int
    test: int
    captions: float
    vocab: int
    source: str


def dataset_sizes(params: dict[str, Any], ds: Dataset, costs: dict[str, Any]) -> Sizes:
    """From ``data/<ds>/annotations.json`` where it exists, else the generator's settings (generated
    sets), else the known sizes of step_costs.yaml (by dataset name, then by raw file name)."""
    vocab_path = Path(VOCAB.format(dataset=ds.name))
    vocab = len(io.read_json(vocab_path, "vocabulary")["idx_to_word"]) if vocab_path.exists() else None
    ann = Path(ANNOTATIONS.format(dataset=ds.name))
    if ann.exists():
        images = io.read_json(ann, "annotations file")["images"]
        count = {s: sum(1 for i in images if i["split"] == s) for s in ("train", "val", "test")}
        caps = [len(i["captions"]) for i in images if i["split"] == "train"]
        return Sizes(count["train"], count["val"], count["test"], sum(caps) / max(1, len(caps)), vocab or 10000,
                     str(ann))
    if ds.generate:
        syn = params_mod.dataset_spec(params, ds.name)["synthetic"]
        captions = synthetic_video.N_SENTENCES if ds.format == "tgif" else grammar.N_REFERENCES
        return Sizes(syn["n_train"], syn["n_val"], syn["n_test"], captions, vocab or 100, "params synthetic:")
    known = costs["datasets"].get(ds.name) or costs["datasets"].get(costs["raw_names"].get(os.path.basename(ds.raw), ""))
    if known is None:
        raise CaprlError(f"datasets.{ds.name}: no {ann} yet and no known size for it (known: "
                         f"{', '.join(costs['datasets'])}); run `caprl prepare` for it first")
    return Sizes(known["train"], known["val"], known["test"], known["captions"], vocab or known["vocab"],
                 f"known size: {known['source']}")


def regions_of(params: dict[str, Any], ds: Dataset) -> int:
    """Regions an attention model attends over: the backbone's grid cells, 36 boxes, or a video's frames."""
    features = params_mod.dataset_features(params, ds.name)
    if ds.format == "tgif":
        return int(features["video"]["frames"])
    if ds.bottomup:
        return 36
    if ds.backbone == "clip":
        from caprl.features.clip_grid import clip_grid

        return clip_grid(features["clip"]) ** 2
    return int(features.get("resnet" if ds.backbone.startswith("resnet") else ds.backbone, {}).get("grid", 6)) ** 2


def model_hidden(model: dict[str, Any]) -> int:
    """The hidden size of a ``models:`` entry as its architecture's config reads it (defaults filled in):
    the LSTMs' ``hidden_size``, the transformer's ``d_model`` (``TransformerConfig.hidden_size``)."""
    from caprl.models import MODELS

    config = MODELS.get(model["arch"]).config_class.from_dict({k: v for k, v in model.items() if k != "arch"},
                                                              "models")
    return int(config.hidden_size)


@dataclass
class Row:
    job: str  # as Snakemake names it: rule dataset[/run or shard or table]
    rule: str
    dataset: str
    run: str | None
    target: str  # all_tables, or tuning (the tuning points and their report)
    gpu: bool
    steps: int | None = None
    hours: float | None = None
    peak_mib: float | None = None
    basis: str = NOT_COSTED


class Estimator:
    """Step times and memory on one device from the cost table."""

    def __init__(self, params: dict[str, Any], costs: dict[str, Any], device: str) -> None:
        if device not in costs["devices"]:
            raise CaprlError(f"--device {device}: the cost table has {', '.join(costs['devices'])}")
        self.params, self.costs, self.device, self.gpu = params, costs, device, device != "cpu"
        self.ref = costs["reference"]

    def points(self, device: str, family: str, arch: str, key: str = "ms") -> dict[int, float] | None:
        entry = self.costs["devices"][device]["steps"].get(family, {}).get(arch)
        return {int(b): float(v[key]) for b, v in entry.items()} if entry else None

    def cpu_ratio(self) -> tuple[float, dict[int, float], float]:
        """(CPU / device ms of the scaling configuration, its device batch curve, the reference batch)."""
        s = self.costs["devices"][self.device]["scale_from_cpu"]
        curve = self.points(self.device, s["family"], s["arch"]) or {}
        cpu = self.points("cpu", s["family"], s["arch"]) or {}
        return interp(cpu, s["batch"]) / interp(curve, s["batch"]), curve, s["batch"]

    def base_ms(self, family: str, arch: str, batch: float) -> tuple[float, str]:
        """ms per step of a measured family and arch at ``batch`` (reference sizes), and its basis."""
        own, cpu = self.points(self.device, family, arch), self.points("cpu", family, arch)
        if own:
            return interp(own, batch), "measured"
        if cpu is None or "scale_from_cpu" not in self.costs["devices"][self.device]:
            raise CaprlError(f"{COSTS.name}: no {family}-{arch} figure for {self.device} nor one to scale from")
        ratio, curve, ref = self.cpu_ratio()
        return interp(cpu, ref) / ratio * interp(curve, batch) / interp(curve, ref), "scaled from CPU"

    def lookup(self, method: str, arch: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """The cost-table entries of a method and an architecture, the fallbacks where none, and notes."""
        m = self.costs["methods"].get(method) or self.costs["fallback_method"]
        a = self.costs["architectures"].get(arch) or self.costs["fallback_arch"]
        notes = [f"fallback: method {method} as {m['like']}"] if method not in self.costs["methods"] else []
        if arch not in self.costs["architectures"]:
            notes.append(f"fallback: arch {arch} as {a['like']}")
        elif a["like"] != arch:
            notes.append(f"{arch} = {a['factor']:g} x {a['like']}")
        return m, a, notes

    def work(self, rule: str, options: dict[str, Any], captions: float) -> float:
        """Decode passes of one caption per image (forward 1, with backward 3): step_costs.yaml, methods."""
        n = options.get("n_samples", self.ref["n_samples"])
        if rule == "captions":
            return 3 * captions
        if rule == "rollouts":
            return 3 + options["rollouts"] * self.params["decode"]["max_length"] / 2  # pg_spider: K roll-outs
        return 3 * captions * n if rule == "per_caption" else 1 + 3 * n

    def ref_work(self, family: str) -> float:
        return self.work("captions" if family == "xe" else "samples", {}, self.ref["captions"])

    def size_factor(self, hidden: int, regions: int, family: str, attention: bool) -> float:
        size = (hidden / self.ref["hidden"]) ** 2
        k = self.costs["regions"].get(family, 0.0) if attention else 0.0
        return (max(1.0, size) if self.gpu else size) * (1 + k * (regions / self.ref["regions"] - 1))

    def step(self, job: TrainJob, sizes: Sizes, regions: int, batch: float) -> tuple[float, float, str]:
        """(ms per optimiser update, work relative to the family's reference, basis) of a run."""
        spec, model = job.spec, self.params["models"][job.spec.model]
        m, a, notes = self.lookup(spec.method, model["arch"])
        work = self.work(m["work"], spec.options, sizes.captions) * m.get("factor", 1.0) / self.ref_work(m["like"])
        ms, basis = self.base_ms(m["like"], a["like"], batch)
        ms *= a["factor"] * work * self.size_factor(model_hidden(model), regions, m["like"], a["attention"])
        if abs(work - 1) > 1e-9:
            notes.append(f"work {work:.2g} x {m['like']}")
        if a["attention"] and regions != self.ref["regions"]:
            notes.append(f"{regions} regions")
        return ms, work, "; ".join([basis, *notes])

    def decode_ms(self, arch: str, hidden: int, regions: int) -> tuple[float, str]:
        """ms per decode unit (one caption of one image, forward only): 1/16 of an SCST step per image."""
        _, a, notes = self.lookup("scst", arch)
        batch = self.params["evaluate"]["batch_size"]
        ms, basis = self.base_ms("scst", a["like"], batch)
        unit = ms / batch / self.ref_work("scst") * a["factor"] * self.size_factor(hidden, regions, "scst", a["attention"])
        return unit, "; ".join([basis, *notes])

    def memory(self, family: str, arch: dict[str, Any], model: dict[str, Any], batch: float, work: float,
               vocab: int, feat_dim: int, training: bool = True) -> float:
        """Peak MiB (an estimate: the rule in the module's docstring)."""
        rss = self.points("cpu", family, arch["like"], "rss_mib") or self.points("cpu", "scst", "topdown", "rss_mib")
        lo, hi = sorted(rss)[:2]
        slope, h = (rss[hi] - rss[lo]) / (hi - lo), model_hidden(model)
        act = slope * batch * work * h / self.ref["hidden"] / (1 if training else self.ref["max_length"])
        if not self.gpu:
            return rss[lo] - slope * lo + act
        e, att = model.get("embed_size", h), model.get("att_hidden_size", h)
        n = (vocab * e + arch["heads"] * vocab * h + arch["lstms"] * 4 * h * (e + h + feat_dim)
             + arch["attentions"] * att * (feat_dim + h))
        return n * (16 if training else 4) / 2**20 + act + self.costs["gpu_context_mib"]


@dataclass
class Estimate:
    rows: list[Row]
    sizes: dict[str, Sizes]


def estimate(params: dict[str, Any], device: str = "h100", costs: dict[str, Any] | None = None) -> Estimate:
    """One row per job of the plan, dataset by dataset, in the order the data flows."""
    costs = costs or load_costs()
    est, plan = Estimator(params, costs, device), build_plan(params)
    out = Estimate([], {})
    for ds in plan.datasets.values():
        out.sizes[ds.name] = sizes = dataset_sizes(plan.params, ds, costs)
        out.rows += _dataset_rows(est, plan, ds, sizes, regions_of(plan.params, ds))
    return out


def _dataset_rows(est: Estimator, plan: Plan, ds: Dataset, sizes: Sizes, regions: int) -> list[Row]:
    params, n = plan.params, ds.name
    cpu = lambda rule, name=None: Row(f"{rule} {n}" + (f"/{name}" if name else ""), rule, n, None, "all_tables", False)
    rows = [cpu("synthesize_video" if ds.format == "tgif" else "synthesize")] if ds.generate else []
    rows += [cpu(rule) for rule in ("prepare", "vocab", "references", "cider_df")]
    backbone = est.costs["backbones"].get(ds.backbone, {})
    if ds.bottomup:
        rows.append(cpu("bottomup_features"))
    else:
        shards = params["features"]["shards"]
        frames = params_mod.dataset_features(params, n)["video"]["frames"] if ds.format == "tgif" else 1
        images = math.ceil((sizes.train + sizes.val + sizes.test) / len(shards))
        for shard in shards:
            row = Row(f"features {n}/shard{shard}", "features", n, None, "all_tables",
                      ds.backbone not in CPU_BACKBONES, images, basis=f"{images:,} images x {frames} frames")
            if backbone.get("ms") is not None and (row.gpu or not est.gpu):
                row.hours = images * frames * backbone["ms"] / (est.cpu_ratio()[0] if est.gpu else 1) / 3.6e6
                row.basis = f"{'scaled from CPU' if est.gpu else 'measured'}; {row.basis}"
            else:
                row.basis = f"{NOT_COSTED}; {row.basis}"
            rows.append(row)
        rows.append(cpu("merge_features"))
    feat_dim = int(backbone.get("dim", 2048))
    jobs = [job for (dsn, _), job in plan.jobs.items() if dsn == n]
    rows += [_train_row(est, job, sizes, regions, feat_dim) for job in jobs]
    evaluated = {job.run for job in plan.evaluated(n)}
    rows += [_eval_row(est, j, sizes, regions, feat_dim, "evaluate", _decode_units(params, j))
             for j in jobs if j.run in evaluated]
    retrieved = {job.run for job in plan.retrieved(n) + plan.gold_retrieved(n)}
    rows += [_eval_row(est, j, sizes, regions, feat_dim, "gold_retrieval" if j.gold_retrieval else "retrieval", 1.0)
             for j in jobs if j.run in retrieved]
    rows.append(cpu("baseline"))
    rows += [cpu("attention_figure")] if plan.attention_job(n) is not None else []
    rows += [cpu("psst_figures")] if plan.psst_pngs(n) else []
    rows += [cpu("curves")] if plan.curve_files(n) else []
    rows += [cpu("tables", table) for table in plan.tables(n)]
    rows += [Row(f"tune_report {n}", "tune_report", n, None, "tuning", False)] if plan.tuning_points(n) else []
    return rows


def _train_row(est: Estimator, job: TrainJob, sizes: Sizes, regions: int, feat_dim: int) -> Row:
    from caprl.objectives import OBJECTIVES

    params, spec = est.params, job.spec
    model = params["models"][spec.model]
    gpus = int(params["train"].get("gpus", 1)) if est.gpu else 1
    batch = params["train"]["batch_size"]
    ms, work, basis = est.step(job, sizes, regions, batch / gpus)
    turns = max(1, len(OBJECTIVES.get(spec.method).turns or ())) if spec.method in OBJECTIVES else 1
    steps = spec.options["epochs"] * math.ceil(sizes.train / batch) * turns  # one update per turn
    validations = spec.options["epochs"] + (1 if spec.init else 0)
    total_ms = steps * ms + validations * sizes.val * est.decode_ms(model["arch"], model_hidden(model), regions)[0]
    m, a, _ = est.lookup(spec.method, model["arch"])
    return Row(f"train {job.dataset}/{job.run}", "train", job.dataset, job.run, "tuning" if job.tuning else "all_tables",
               True, steps, total_ms * gpus / 3.6e6,
               est.memory(m["like"], a, model, batch / gpus, work, sizes.vocab, feat_dim), basis)


def _decode_units(params: dict[str, Any], job: TrainJob) -> float:
    """Decode units per evaluated image: the run's decoding, the greedy captions, diversity, lookahead."""
    from caprl.objectives import OBJECTIVES

    decode, ev = job.spec.decode, params["evaluate"]
    units = (float(decode["beam_size"]) if decode["method"] != "greedy" else 1.0) + (1.0 if ev.get("greedy") else 0.0)
    diversity = ev.get("diversity") or {}
    if job.spec.method in diversity.get("methods", []):
        units += diversity.get("samples", 0) + diversity.get("beams", 0)
    if ev.get("lookahead") and "value" in getattr(OBJECTIVES.get(job.spec.method), "holds", ()):
        units += 2 * decode["beam_size"]
    return units


def _eval_row(est: Estimator, job: TrainJob, sizes: Sizes, regions: int, feat_dim: int, rule: str,
              units: float) -> Row:
    model, batch = est.params["models"][job.spec.model], est.params["evaluate"]["batch_size"]
    images = {"train": sizes.train, "val": sizes.val, "test": sizes.test}[est.params["evaluate"]["split"]]
    unit_ms, basis = est.decode_ms(model["arch"], model_hidden(model), regions)
    _, a, _ = est.lookup("scst", model["arch"])
    mem = est.memory("scst", a, model, batch, units / est.ref_work("scst"), sizes.vocab, feat_dim, training=False)
    return Row(f"{rule} {job.dataset}/{job.run}", rule, job.dataset, job.run, "all_tables", True,
               math.ceil(images / batch), images * units * unit_ms / 3.6e6, mem, f"{basis}; {units:g} units/image")
