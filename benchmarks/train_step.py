"""Time per optimiser step and peak memory of training, at COCO sizes, on data it builds itself.

    python benchmarks/train_step.py [--device cpu|cuda] [--amp none|bf16] [--json PATH]
                                    [--configs xe-fc xe-topdown scst-fc scst-topdown] [--batches 10 50]
                                    [--steps 20] [--warmup 3] [--rss-sizes 1000 4000 16000] [--workdir DIR]

Data (built once under ``--workdir``, a temporary folder by default): the real COCO
captions of ``../shared/data/coco/karpathy_val5k_captions.json``, 5 per image, images by id:
the first 4,500 train, the rest val; vocabulary = train words seen >= 5 times; captions
clipped to 16 tokens; seeded random 2048-d pooled and 36 x 2048 region features in an HDF5
features file, read from disk as training reads it (``loading.in_memory: false``).

Each configuration runs in a fresh process (so its peak RSS is its own), through caprl's
``Trainer`` step (batch read + prefetch, loss, backward, clipping, Adam): XE, and SCST
with 5 samples per image, the greedy caption as baseline and the CIDEr-D reward, for the
``fc`` and ``topdown`` models at hidden/embedding/attention 512, dropout 0.5, and (when named in
``--configs``) the ``transformer`` at SCP's recipe sizes (6 + 6 layers, d_model 512, 8 heads, d_ff
2048) or ``transformer_small`` (2 + 2 layers, d_model 256, 8 heads, d_ff 1024). Reported:
median / min / max ms per step over ``--steps`` steps after ``--warmup`` (a step's time
runs from the end of the previous step, so waiting for the next batch counts; the median
wait is shown too), images per second, and the process's peak RSS. The second table trains SCST Top-Down on features
files of several sizes, to show that the RSS does not grow with the dataset.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CAPTIONS = REPO / "../shared/data/coco/karpathy_val5k_captions.json"
N_TRAIN, PER_IMAGE, MIN_COUNT, MAX_LENGTH = 4500, 5, 5, 16
DIM, REGIONS, SIZE = 2048, 36, 512
DEFAULT_CONFIGS = ("xe-fc", "xe-topdown", "scst-fc", "scst-topdown", "sll_sle-fc", "sll_sle-topdown")
#: arch ``transformer``: SCP's recipe sizes (configs/transformer/transformer.yml); ``transformer_small``: a
#: CPU-sized setting the SCP side shares (gpu_compare.py passes these to scp_transformer_step.py)
TRANSFORMER_SIZES = {"transformer": {"num_layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048},
                     "transformer_small": {"num_layers": 2, "d_model": 256, "heads": 8, "d_ff": 1024}}
#: issue 57's objectives beside SCST (and NSC: scst with baseline nsc), on every one-stage model
POLICY_METHODS = ("nsc", "grpo", "ppo_kl", "dico")
CONFIGS = (DEFAULT_CONFIGS + tuple(f"{m}-{t}" for m in ("xe", "scst") for t in TRANSFORMER_SIZES)
           + tuple(f"{m}-{a}" for m in POLICY_METHODS for a in ("fc", "topdown", *TRANSFORMER_SIZES)))
CONSTANT_LR = {"lr_decay_every": 0, "lr_decay_rate": 1.0}
OPTIONS = {
    "xe": {"lr": 5e-4, "epochs": 1, **CONSTANT_LR},
    "scst": {"lr": 5e-5, "epochs": 1, **CONSTANT_LR, "n_samples": 5, "reward": "cider_d", "temperature": 1.0,
             "entropy": 0.0},
    "sll_sle": {"lr": 5e-5, "epochs": 1, **CONSTANT_LR, "n_samples": 5, "reward": "cider_d", "temperature": 1.0,
                "alpha": 0.75, "diversity": "pairwise"},
    # params.yaml's objectives.<method> (5 samples / candidates each, the CIDEr-D reward), COCO's RL rate
    "grpo": {"lr": 5e-5, "epochs": 1, **CONSTANT_LR, "n_samples": 5, "reward": "cider_d", "scale_rewards": "group",
             "loss_type": "grpo", "epsilon": 0.2, "epsilon_high": 0.2, "num_iterations": 2, "beta": 0.04},
    "ppo_kl": {"lr": 5e-5, "epochs": 1, **CONSTANT_LR, "n_samples": 5, "reward": "cider_d", "kl_coef": 0.2,
               "kl_target": 0.0, "kl_horizon": 10000, "noptepochs": 4, "cliprange": 0.2, "cliprange_value": 0.2,
               "vf_coef": 0.1, "gamma": 1.0, "lam": 0.95, "whiten_rewards": True},
    "dico": {"lr": 5e-5, "epochs": 1, **CONSTANT_LR, "candidates": 5, "reward": "cider_d", "beta": 0.2, "tau": 300.0,
             "candidate_mode": "train"},
}
OPTIONS["nsc"] = {**OPTIONS["scst"], "baseline": "nsc"}
METHOD = {"nsc": "scst"}  # a config's method name -> the registered objective


# --- data ---------------------------------------------------------------------------------
def coco_images(path: Path) -> list[tuple[int, list[str]]]:
    """(image id, its first 5 raw captions), images sorted by id."""
    data = json.loads(path.read_text(encoding="utf-8"))
    caps: dict[int, list[str]] = defaultdict(list)
    for ann in data["annotations"]:
        caps[int(ann["image_id"])].append(ann["caption"])
    return [(i, caps[i][:PER_IMAGE]) for i in sorted(caps) if len(caps[i]) >= PER_IMAGE]


def build_data(workdir: Path, n_images: int | None = None, seed: int = 0, captions: Path = CAPTIONS) -> dict[str, str]:
    """Annotations, vocabulary, labels and features files for ``n_images`` images (default: the
    5k val images); more images than that reuse the captions cyclically under new ids."""
    from caprl import io
    from caprl.io import provenance
    from caprl.data.karpathy import prepare_annotations
    from caprl.data.vocab import build_vocab, encode_labels, write_labels
    from caprl.data.feature_store import open_writer
    from caprl.rewards import compute_document_frequencies
    from caprl.rewards.document_frequencies import save_document_frequencies
    from caprl.data.annotations import references_from_annotations

    paths = {k: str(workdir / f) for k, f in (("annotations", "annotations.json"), ("vocab", "vocab.json"),
                                                ("labels", "labels.h5"), ("features", "features.h5"),
                                                ("cider_df", "cider_df.npz"))}
    if all(Path(p).exists() for p in paths.values()):
        return paths
    workdir.mkdir(parents=True, exist_ok=True)
    base = coco_images(captions)
    n = n_images or len(base)
    n_train = min(N_TRAIN, n - n // 10) if n_images else N_TRAIN
    images = [{"cocoid": k + 1, "filename": f"{k + 1}.jpg", "split": "train" if k < n_train else "val",
               "sentences": [{"raw": c} for c in base[k % len(base)][1]]} for k in range(n)]
    annotations = prepare_annotations({"images": images}, "bench")
    io.write_json(paths["annotations"], annotations, indent=None)
    vocab = build_vocab(annotations, MIN_COUNT, MAX_LENGTH)
    write_labels(paths["labels"], encode_labels(annotations, vocab), vocab, provenance.record(annotations))
    io.write_json(paths["vocab"], vocab.to_json(), indent=None)
    df = compute_document_frequencies(references_from_annotations(annotations, "train"))
    save_document_frequencies(df, paths["cider_df"])
    rng = np.random.default_rng(seed)
    attrs = {"backbone": "random", "grid": 6, "dim": DIM, "n_regions": REGIONS, **provenance.record(annotations)}
    with open_writer(paths["features"], n, DIM, REGIONS, attrs) as writer:
        for start in range(0, n, 256):
            ids = np.arange(start + 1, min(n, start + 256) + 1)
            writer.write(ids, rng.random((len(ids), DIM), dtype=np.float32),
                         rng.random((len(ids), REGIONS, DIM), dtype=np.float32))
    return paths


# --- one configuration, in its own process ------------------------------------------------
def model_options(arch: str) -> tuple[str, dict[str, Any]]:
    """The registered arch and its options: ``fc`` / ``topdown`` at 512 units, dropout 0.5; the
    transformers at :data:`TRANSFORMER_SIZES`, dropout 0.1 and 0.5 on the embedded regions (SCP's)."""
    if arch in TRANSFORMER_SIZES:
        return "transformer", {**TRANSFORMER_SIZES[arch], "dropout": 0.1, "feat_dropout": 0.5,
                               "max_positions": MAX_LENGTH + 1}
    sizes: dict[str, Any] = {"embed_size": SIZE, "hidden_size": SIZE, "dropout": 0.5}
    if arch == "topdown":
        sizes["att_hidden_size"] = SIZE
    return arch, sizes


def run_config(paths: dict[str, str], config: str, batch: int, steps: int, warmup: int, device: str,
               amp: str, in_memory: bool, threads: int, profile: str | None = None,
               plain_autograd: bool = False, cuda_graphs: bool = False) -> dict[str, Any]:
    """One configuration's timed steps; ``plain_autograd``: every layer as plain autograd (no
    weight-gradient tapes, :mod:`caprl.models.timeshared`), to measure what the tapes gain."""
    from caprl.models import timeshared

    with timeshared.disabled() if plain_autograd else contextlib.nullcontext():
        out = _run_config(paths, config, batch, steps, warmup, device, amp, in_memory, threads, profile, cuda_graphs)
    return {**out, "plain_autograd": plain_autograd}


def _run_config(paths: dict[str, str], config: str, batch: int, steps: int, warmup: int, device: str,
                amp: str, in_memory: bool, threads: int, profile: str | None, cuda_graphs: bool) -> dict[str, Any]:
    import torch

    from caprl.data.loader import CaptionData, DataPaths, Loading
    from caprl.models import build_model
    from caprl.objectives import ObjectiveEnv, build_objective
    from caprl.rewards import build_reward, load_document_frequencies
    from caprl.training.distributed import Dist
    from caprl.training.loop import LoopConfig, RunMeta, Trainer, epoch_order
    from caprl.tracking import Tracker

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    method, arch = config.split("-")
    data = CaptionData(DataPaths(paths["annotations"], paths["vocab"], paths["labels"], paths["features"]),
                       Loading(in_memory=in_memory, cache_mib=64))
    model = build_model(*model_options(arch), len(data.vocab), data.feat_dim, data.n_regions)
    reward = build_reward("cider_d", data.references("train"), load_document_frequencies(paths["cider_df"]))
    env = ObjectiveEnv(decode_words=data.decode, reward=lambda _name: reward, max_length=MAX_LENGTH)
    objective = build_objective(METHOD.get(method, method), OPTIONS[method], env, model)
    objective.begin(model)  # a reference policy: a copy of the start
    loop = LoopConfig(epochs=1, batch_size=batch, grad_clip=2.0, checkpoint_every=10**9,
                      log_every=10**9, max_length=MAX_LENGTH, seed=0, amp=amp, cuda_graphs=cuda_graphs)
    with tempfile.TemporaryDirectory() as state_dir:
        trainer = Trainer(model, objective, data, loop, lambda m: {}, Path(state_dir),
                          RunMeta(arch, {}, data.vocab.sha256, ""), Tracker("bench", "bench", enabled=False),
                          Dist(device=torch.device(device)))
        order = epoch_order(data.split_ids("train"), 0, 0)
        batches = [order[(k * batch) % len(order):][:batch] for k in range(warmup + steps)]
        times, waits = [], []
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        done = time.perf_counter()  # a step's time runs from the end of the previous one: waiting for data counts
        for k, (ids, loaded) in enumerate(trainer.batches(batches)):
            sync()
            waited = time.perf_counter() - done
            trainer.step(ids, loaded)
            sync()
            if k >= warmup:
                times.append(time.perf_counter() - done)
                waits.append(waited)
            done = time.perf_counter()
        if profile:
            profile_steps(trainer, batches[:2], device, Path(profile))
    ms = [1000 * t for t in times]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"config": config, "batch": batch, "median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1),
           "max_ms": round(max(ms), 1), "data_wait_ms": round(1000 * statistics.median(waits), 1), "images_per_s": round(1000 * batch / statistics.median(ms), 1),
           "peak_rss_mib": round(peak, 1), "params": sum(p.numel() for p in model.parameters()), "steps": len(ms), "device": device, "amp": amp,
           "in_memory": in_memory, "images": len(data.split_ids("train")) + len(data.split_ids("val"))}
    if device.startswith("cuda"):
        out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        graphed = trainer.graphed
        out["cuda_graph"] = {"asked": cuda_graphs, "captured": bool(graphed and graphed.graph is not None),
                             "replays": graphed.replays if graphed else 0, "failed": bool(graphed and graphed.failed)}
    return out


def profile_steps(trainer: Any, batches: list[Any], device: str, out: Path) -> None:
    """Two more steps under torch.profiler: the operators' table and the kernel launches per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for ids, loaded in trainer.batches(batches):
            trainer.step(ids, loaded)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    out.write_text(f"kernel launches per step: {launches / len(batches):.0f}\n\n"
                   + events.table(sort_by=sort, row_limit=40), encoding="utf-8")


def in_process(args: argparse.Namespace, paths: dict[str, str], config: str, batch: int,
               in_memory: bool = False) -> dict[str, Any]:
    """Run one configuration in a fresh Python process; its result is the last stdout line."""
    cmd = [sys.executable, __file__, "--worker", config, str(batch), "--paths", json.dumps(paths),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device, "--amp", args.amp,
           "--threads", str(args.threads)] + (["--in-memory"] if in_memory else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{config} at batch {batch} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    widths = [max(len(title), *(len(str(r[key])) for r in rows)) for key, title in columns]
    lines = ["  ".join(title.rjust(w) for (_, title), w in zip(columns, widths))]
    lines += ["  ".join(str(r[key]).rjust(w) for (key, _), w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=CONFIGS,
                        help="default: all but the transformers (" + ", ".join(sorted(set(CONFIGS) - set(DEFAULT_CONFIGS))) + ")")
    parser.add_argument("--batches", nargs="+", type=int, default=[10, 50])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="none", choices=["none", "bf16"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as the issue's figures)")
    parser.add_argument("--rss-sizes", nargs="*", type=int, default=[1000, 4000, 16000],
                        help="images in the features files of the RSS table (none: skip it)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data is built (kept; default: temp)")
    parser.add_argument("--json", type=Path, default=None, help="write the step-time rows as JSON")
    parser.add_argument("--captions", type=Path, default=CAPTIONS, help="COCO-format captions (default: %(default)s)")
    parser.add_argument("--profile", help="worker only: profile two more steps into this file")
    parser.add_argument("--plain-autograd", action="store_true", help="worker only: no weight-gradient tapes")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="worker only: train.cuda_graphs (XE's whole step as a CUDA graph after 3 eager steps)")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = run_config(json.loads(args.paths), args.worker[0], int(args.worker[1]), args.steps, args.warmup,
                            args.device, args.amp, args.in_memory, args.threads, args.profile, args.plain_autograd,
                            args.cuda_graphs)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        paths = build_data(root / "coco5k", captions=args.captions)
        rows = [in_process(args, paths, c, b) for c in args.configs for b in args.batches]
        print(f"\nms per optimiser step ({args.device}, amp {args.amp}, {args.threads} torch thread(s), "
              f"{args.steps} steps after {args.warmup} warm-up; features read from disk)")
        print(table(rows, [("config", "config"), ("batch", "batch"), ("median_ms", "median ms"), ("min_ms", "min ms"),
                           ("max_ms", "max ms"), ("data_wait_ms", "of which data wait"), ("images_per_s", "images/s"),
                           ("peak_rss_mib", "peak RSS MiB")]))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        if args.rss_sizes:
            sized = []
            for n in args.rss_sizes:
                sized_paths = build_data(root / f"size{n}", n_images=n, seed=1, captions=args.captions)
                on_disk = Path(sized_paths["features"]).stat().st_size / 2**20
                row = in_process(args, sized_paths, "scst-topdown", 50)
                sized.append({**row, "features_mib": round(on_disk, 1), "mode": "from disk"})
                if on_disk < 4096:
                    mem = in_process(args, sized_paths, "scst-topdown", 50, in_memory=True)
                    sized.append({**mem, "features_mib": round(on_disk, 1), "mode": "in memory"})
                if args.workdir is None:
                    Path(sized_paths["features"]).unlink()
            print("\npeak RSS of a training process (scst-topdown, batch 50) against dataset size")
            print(table(sized, [("images", "images"), ("features_mib", "features MiB"), ("mode", "features"),
                                ("peak_rss_mib", "peak RSS MiB"), ("median_ms", "median ms")]))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    main()
