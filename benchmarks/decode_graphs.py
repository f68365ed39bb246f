"""No-gradient decodes eager against replayed from a CUDA graph (:mod:`caprl.decoding.captured`), at COCO sizes.

    python benchmarks/decode_graphs.py [--device cuda] [--batches 50 250] [--repeats 20] [--markdown PATH]

Random weights (hidden/embedding/attention 512, vocabulary 9,487, 36 x 2,048 regions, eval mode),
random features on the device, 16 words. Per decode and batch: the eager time, the replayed time
(``captured.run``; on a CPU nothing is captured and the column says so), whether both give the same
tokens, and the eager decode's GPU busy share (kernel time over wall time, from torch.profiler:
a decode near 100% is bound by its arithmetic and a graph cannot speed it up; one far below is bound
by launching kernels). PG-SPIDEr's roll-outs (``caprl.decoding.rollouts_from_prefixes``: every prefix
of one sample per image completed 3 times, ``batch x 16 x 3`` rows) sample with seeded noise from a
fresh generator per step; they are timed eagerly, with their busy share, to say whether capturing
them would pay.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from caprl import decoding
from caprl.decoding import captured
from caprl.models import build_model

VOCAB, DIM, REGIONS, SIZE, LENGTH, ROLLOUTS = 9487, 2048, 36, 512, 16, 3


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median ms of ``fn()`` over ``repeats`` calls (synchronised on CUDA)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def busy_share(fn: Callable[[], Any], device: torch.device) -> tuple[float, int]:
    """(kernel time / wall time, kernel launches) of one call of ``fn`` on CUDA; (nan, 0) elsewhere."""
    if device.type != "cuda":
        return float("nan"), 0
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / 1e6 / wall, len(kernels)


def decodes(model: Any, ctx: Any, rollout_samples: Any, noise: decoding.Noise) -> dict[str, Callable[[], Any]]:
    return {
        "greedy": lambda: decoding.greedy_decoder(model, ctx, LENGTH),
        "beam 3": lambda: decoding.beam_decoder(model, ctx, LENGTH, beam_size=3),
        "beam 5": lambda: decoding.beam_decoder(model, ctx, LENGTH, beam_size=5),
        "PG-SPIDEr roll-outs": lambda: decoding.rollouts_from_prefixes(model, rollout_samples, ROLLOUTS, LENGTH,
                                                                        noise=noise),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--archs", nargs="+", default=["topdown", "fc"])
    ap.add_argument("--batches", nargs="+", type=int, default=[50, 250])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    rows = ["| model | decode | batch | eager ms | replayed ms | speed-up | same tokens | eager GPU busy | launches |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for arch in args.archs:
        torch.manual_seed(0)
        sizes = {"embed_size": SIZE, "hidden_size": SIZE, "dropout": 0.5}
        model = build_model(arch, sizes | ({"att_hidden_size": SIZE} if arch == "topdown" else {}), VOCAB, DIM,
                            REGIONS).to(device).eval()
        for batch in args.batches:
            gen = torch.Generator(device=device).manual_seed(batch)
            pooled = torch.rand(batch, DIM, device=device, generator=gen)
            regions = torch.rand(batch, REGIONS, DIM, device=device, generator=gen)
            with torch.no_grad():
                ctx = model.encode(pooled, regions)
                noise = decoding.Noise(seed=0, step=0, total=batch)
                samples = decoding.sample(model, ctx, LENGTH, noise=decoding.Noise(seed=1, step=0, total=batch),
                                          keep_states=True)
                for name, fn in decodes(model, ctx, samples, noise).items():
                    captured.set_enabled(False)
                    want = fn()
                    eager = timed(fn, args.repeats, device)
                    busy, launches = busy_share(fn, device)
                    captured.set_enabled(True)
                    replay, same = "eager (no capture here) | —", "—"  # the roll-outs are never captured
                    if device.type == "cuda" and not name.startswith("PG"):
                        got = fn()  # captures
                        replayed = timed(fn, args.repeats, device)
                        same = str(torch.equal(fn(), want) and torch.equal(got, want))
                        replay = f"{replayed:.2f} | {eager / replayed:.1f}x"
                    rows.append(f"| {arch} | {name} | {batch} | {eager:.2f} | {replay} | {same} | "
                                f"{busy:.0%} | {launches} |")
                    print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
