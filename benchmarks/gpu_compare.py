"""caprl's training step against self-critical.pytorch's (SCP), side by side on one GPU.

Runs ``benchmarks/train_step.py`` (caprl) and SCP's own step timer (``scp_step.py`` from the
peers folder, which runs SCP's code; nothing of SCP is imported here) in turn, each
configuration in a fresh process, interleaved (caprl, SCP, caprl, SCP, ... per configuration
and round), on the same data, sizes and batches, and prints one table: images/s of both and
the ratio caprl / SCP. SCP has no SLE objective: its rows show caprl alone. The transformer
configurations (``--configs xe-transformer ...``: SCP's recipe sizes, and ``transformer_small``)
run SCP's ``transformer`` through ``benchmarks/scp_transformer_step.py``, which drives the same
``scp_step.py`` with SCP's model option set to it, at the sizes caprl's side uses.

Set-up of the SCP side (once per machine) is described in ``scp_step.py``'s docstring; this
script does it when ``--setup`` is given (extract SCP, write its data, its n-gram cache).

Usage (on the GPU machine):
  python benchmarks/gpu_compare.py --peers PEERS/self-critical.pytorch --captions CAPTIONS.json \
      --work /tmp/cmp --setup --batches 50 250 --rounds 1 --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ("xe-topdown", "scst-topdown", "xe-fc", "scst-fc", "sll_sle-topdown", "sll_sle-fc")
# the transformers (train_step.TRANSFORMER_SIZES; SCP's side: scp_transformer_step.py): on request only
TRANSFORMERS = ("xe-transformer", "scst-transformer", "xe-transformer_small", "scst-transformer_small")
CONFIGS = DEFAULT_CONFIGS + TRANSFORMERS
SCP_CONFIGS = {"xe-topdown", "scst-topdown", "xe-fc", "scst-fc", *TRANSFORMERS}


def sh(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 900) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... ran past {timeout:.0f} s (--timeout)") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def scp_side(peers: Path, work: Path, captions: Path, feat_images: int,
             setup: bool) -> tuple[Path, Path, dict[str, str]]:
    """SCP's folder, its data folder and the environment it runs in; ``setup``: first extract SCP,
    write its data and its CIDEr-D n-gram cache (scp_step.py's set-up) where missing."""
    scp, data = work / "scp", work / "scp-data"
    env = {**os.environ, "PYTHONPATH": f"{scp}:{peers / 'shims'}:{os.environ.get('PYTHONPATH', '')}"}
    if not setup:
        return scp, data, env
    if not (scp / "captioning").exists():
        scp.mkdir(parents=True, exist_ok=True)
        sh(["tar", "-xzf", str(peers / "scp_py.tgz"), "-C", str(scp)])
    if not (data / "scp" / "df-train-idxs.p").exists():
        sh([sys.executable, str(peers / "make_scp_data.py"), str(data), "--captions", str(captions),
            "--feat-images", str(feat_images)])
        sh([sys.executable, "scripts/prepro_ngrams.py", "--input_json", f"{data}/scp/karpathy.json",
            "--dict_json", f"{data}/scp/data.json", "--output_pkl", f"{data}/scp/df-train", "--split", "train"],
           env=env, cwd=scp)
    return scp, data, env


def run_caprl(paths: dict[str, str], config: str, batch: int, args: argparse.Namespace,
              plain: bool = False, graphs: bool = True) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "benchmarks/train_step.py"), "--worker", config, str(batch),
           "--paths", json.dumps(paths), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--device", args.device, "--amp", "none", "--threads", str(args.threads)] + (["--plain-autograd"] if plain else [])
    cmd += ["--cuda-graphs"] if graphs else []
    out = sh(cmd, env={**os.environ, "TQDM_DISABLE": "1"}, timeout=args.timeout)
    return json.loads(out.strip().splitlines()[-1])


def run_scp(peers: Path, scp: Path, data: Path, env: dict[str, str], config: str, batch: int,
            args: argparse.Namespace) -> dict[str, Any]:
    from train_step import TRANSFORMER_SIZES  # the sizes caprl's side builds

    cmd = [sys.executable, str(peers / "scp_step.py"), config]
    method, arch = config.split("-")
    if arch in TRANSFORMER_SIZES:
        s = TRANSFORMER_SIZES[arch]
        cmd = [sys.executable, str(REPO / "benchmarks/scp_transformer_step.py"), str(peers / "scp_step.py"), method,
               "--layers", str(s["num_layers"]), "--d-model", str(s["d_model"]), "--heads", str(s["heads"]),
               "--d-ff", str(s["d_ff"]), "--name", config]
    cmd += ["--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device,
            "--threads", str(args.threads), "--data", str(data), "--scp", str(scp)]
    out = sh(cmd, env=env, timeout=args.timeout)
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _ips(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def markdown(rows: list[dict[str, Any]], note: str, memory: str = "GPU") -> str:
    """``memory``: "GPU" (peak CUDA memory) or "RSS" (peak resident set, on a CPU)."""
    plain = any("plain_ms" in r for r in rows)
    eager = any("eager_ms" in r for r in rows)
    params = any(r.get("scp_params") for r in rows)  # the transformers: both sides' sizes, checked by their counts
    lines = [f"{note}", "", "| config | batch | caprl ms | caprl images/s | SCP ms | SCP images/s | caprl / SCP |"
             f" caprl peak {memory} MiB | SCP peak {memory} MiB |" + (" caprl plain autograd ms |" if plain else "")
             + (" caprl without CUDA graphs ms |" if eager else "") + (" parameters caprl / SCP |" if params else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if plain else "") + ("---:|" if eager else "")
             + ("---:|" if params else "")]
    for r in rows:
        scp = r.get("scp_ms")
        mem = ("caprl_gpu_mib", "scp_gpu_mib") if memory == "GPU" else ("caprl_rss_mib", "scp_rss_mib")
        lines.append(f"| {r['config']} | {r['batch']} | {r['caprl_ms']:.1f} | {_ips(r['caprl_ips'])} | "
                     + (f"{scp:.1f} | {_ips(r['scp_ips'])} | {r['ratio']:.2f}x" if scp else "— | — | —")
                     + f" | {r.get(mem[0]) or '—'} | {r.get(mem[1]) or '—'} |"
                     + (f" {r['plain_ms']:.1f} |" if "plain_ms" in r else (" — |" if plain else ""))
                     + (f" {r['eager_ms']:.1f} |" if "eager_ms" in r else (" — |" if eager else ""))
                     + (f" {r.get('caprl_params', '—')} / {r.get('scp_params') or '—'} |" if params else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=Path, required=True, help="the peers folder's self-critical.pytorch/")
    p.add_argument("--captions", type=Path, required=True, help="karpathy_val5k_captions.json")
    p.add_argument("--work", type=Path, required=True, help="where both sides' data is built (kept)")
    p.add_argument("--setup", action="store_true", help="extract SCP and build its data first")
    p.add_argument("--configs", nargs="*", default=list(DEFAULT_CONFIGS), choices=CONFIGS,
                   help="none: set up only; default: all but the transformers (" + ", ".join(TRANSFORMERS) + ")")
    p.add_argument("--batches", nargs="+", type=int, default=[50, 250])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="interleaved repetitions (medians of the rounds)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--plain-autograd", action="store_true",
                   help="also time caprl with plain autograd (no weight-gradient tapes)")
    p.add_argument("--no-graphs", action="store_true", help="caprl without CUDA graphs (train.cuda_graphs: false)")
    p.add_argument("--eager-too", action="store_true",
                   help="also time caprl without CUDA graphs (what its whole-step capture gains)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one side's process may run")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from train_step import build_data  # caprl's side of the same data

    feat_images = max(args.batches) * (args.steps + args.warmup)
    if feat_images > 4500:
        raise SystemExit(f"batch {max(args.batches)} x {args.steps + args.warmup} steps needs {feat_images} "
                         "distinct train images; SCP's data has 4,500: use fewer steps")
    t0 = time.time()
    paths = build_data(args.work / "caprl", captions=args.captions)
    scp, data, env = scp_side(args.peers, args.work, args.captions, feat_images, args.setup)
    print(f"data ready in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for config in args.configs:
        for batch in args.batches:
            mine, theirs, plain, eager = [], [], [], []
            for _ in range(args.rounds):
                mine.append(run_caprl(paths, config, batch, args, graphs=not args.no_graphs))
                if args.eager_too:
                    eager.append(run_caprl(paths, config, batch, args, graphs=False))
                if args.plain_autograd:
                    plain.append(run_caprl(paths, config, batch, args, plain=True))
                if config in SCP_CONFIGS:
                    try:
                        theirs.append(run_scp(args.peers, scp, data, env, config, batch, args))
                    except RuntimeError as exc:
                        print(f"SCP {config} batch {batch}: {exc}", flush=True)
            row: dict[str, Any] = {"config": config, "batch": batch,
                                   "caprl_ms": statistics.median(r["median_ms"] for r in mine),
                                   "caprl_gpu_mib": mine[-1].get("peak_gpu_mib"), "caprl_params": mine[-1].get("params"),
                                   "caprl_rss_mib": max(r["peak_rss_mib"] for r in mine),
                                   "caprl_runs": mine}
            row["caprl_ips"] = batch * 1000 / row["caprl_ms"]
            if plain:
                row["plain_ms"] = statistics.median(r["median_ms"] for r in plain)
                row["plain_runs"] = plain
            if eager:
                row["eager_ms"] = statistics.median(r["median_ms"] for r in eager)
                row["eager_runs"] = eager
            if theirs:
                row["scp_ms"] = statistics.median(r["median_ms"] for r in theirs)
                row["scp_ips"] = batch * 1000 / row["scp_ms"]
                row["ratio"] = row["caprl_ips"] / row["scp_ips"]
                row["scp_gpu_mib"] = round(theirs[-1].get("peak_cuda_mib", 0), 1)
                row["scp_params"] = theirs[-1].get("params")
                row["scp_rss_mib"] = round(max(r["peak_rss_mib"] for r in theirs), 1)
                row["scp_runs"] = theirs
            rows.append(row)
            report(rows, args)
            print(f"{config:16s} {batch:4d}  caprl {row['caprl_ms']:7.1f} ms"
                  + (f" (plain autograd {row['plain_ms']:7.1f} ms)" if plain else "")
                  + (f" (no CUDA graphs {row['eager_ms']:7.1f} ms)" if eager else "")
                  + (f"  SCP {row['scp_ms']:7.1f} ms  ratio {row['ratio']:.2f}x" if theirs else ""), flush=True)
    if rows:
        print("\n" + report(rows, args))


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The table so far (written after every configuration: a run cut short keeps its rows)."""
    import torch

    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    note = (f"Device {device}, torch {torch.__version__}, {args.steps} timed steps after {args.warmup} warm-up, "
            f"{args.rounds} interleaved round(s), fp32.")
    text = markdown(rows, note, "GPU" if args.device.startswith("cuda") else "RSS")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    return text


if __name__ == "__main__":
    main()
