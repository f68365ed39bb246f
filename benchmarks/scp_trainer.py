"""Run self-critical.pytorch's (SCP) OWN trainer on caprl's synthetic set: XE, then SCST from the
best XE epoch, with the settings of caprl's demo runs (`fc-xe` -> `fc-scst`, or Top-Down's), so the
two trainers can be compared side by side on the validation split. Reference harness only: it
drives SCP's `tools/train.py` and `tools/eval.py` (commit 4c48a33, MIT licence) from outside, in
subprocesses of this script, and never copies SCP code into the project.

Set-up, once per machine (SCP's sources from the peers folder; pycocoevalcap and Java for CIDEr-D):
  mkdir -p /tmp/scp && tar -xzf /work/shared/peers/self-critical.pytorch/scp_py.tgz -C /tmp/scp
  pip install yacs
A caprl workflow directory holding the synthetic set (params.yaml with synthetic_video disabled):
  CAPRL_PARAMS_SCHEMA=$PWD/workflow/schemas/params.schema.yaml snakemake -s $PWD/Snakefile \
    --directory DIR --cores 1 data/synthetic/{features_tinycnn.h5,vocab.json,refs_val.json,refs_test.json}
Run (1 thread; --xe-epochs/--scst-epochs shorten a smoke run):
  OMP_NUM_THREADS=1 python benchmarks/scp_trainer.py --workdir DIR --scp /tmp/scp --seed 1 --out results.json
    [--model newfc|updown] [--xe-epochs N --scst-epochs M] [--rundir RUNS]

What it does: converts the set to SCP's format (DIR/scp_data: caprl's vocabulary, split, captions
clipped to 16 tokens and features; the CIDEr-D df by SCP's scripts/prepro_ngrams.py over train),
trains with SCP's tools/train.py (validation every epoch: greedy, all val images; SCP keeps the best
by val CIDEr), SCST from the best XE epoch's model and infos (epoch counter and best val score carried
on, so the start competes for the best SCST checkpoint; no optimizer.pth: a fresh Adam, as caprl's
init), then scores the best SCST checkpoint on test with SCP's tools/eval.py (greedy and beam 5).
Writes --out: the per-epoch val CIDEr-D of XE and SCST, the chosen epochs, the test scores.
Neutralised from outside SCP's code (in the child processes only): `.cuda()` and
`torch.cuda.synchronize` (CPU), DataLoader workers and pinned memory (num_workers=4 hard-coded), the
unused `skimage` / tensorboard / torchvision (eval.py's raw-image loader) imports where missing, and
`eval_utils.language_eval` (coco-caption's COCO annotation files, METEOR and SPICE) by CIDEr-D alone:
pycocoevalcap's PTB tokenizer + Cider on caprl's data/synthetic/refs_<split>.json, as coco-caption
scores it. SCP has no seed option: the child seeds random, numpy and torch (reruns are identical).
SCP counts an epoch when its sampler wraps, one batch late: its epoch 1 is 25 batches, then 24.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import runpy
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
PEERS = Path("/work/shared/peers/self-critical.pytorch")
CAPRL_MODEL = {"newfc": "fc", "updown": "topdown"}  # SCP caption_model -> caprl models:/runs: name
NEUTRALISED = ["Module.cuda/Tensor.cuda -> no-op on cpu", "torch.cuda.synchronize -> no-op on cpu",
               "torch DataLoader: num_workers=0, pin_memory=False",
               "skimage, tensorboard, eval.py's dataloaderraw (torchvision) stubbed where missing",
               "eval_utils.language_eval -> CIDEr-D only (pycocoevalcap PTBTokenizer + Cider, caprl refs_<split>)",
               "seeds: random, numpy, torch set before SCP's script runs"]


# ---------------------------------------------------------------- child: one SCP script, patched
def child(script: str, args: list[str]) -> None:
    """Run one SCP script (train.py, eval.py, prepro_ngrams.py) in this process, patched."""
    cfg = json.loads(os.environ["SCP_HARNESS"])
    sys.path[:0] = [cfg["scp"], os.path.join(cfg["scp"], "cider"), cfg["shims"]]
    import torch

    torch.set_num_threads(cfg["threads"])
    random.seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    if cfg["device"] == "cpu":
        torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    base = torch.utils.data.DataLoader

    class InProcessLoader(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **{**k, "num_workers": 0, "pin_memory": False})

    torch.utils.data.DataLoader = InProcessLoader  # type: ignore[misc]
    stub_missing()
    import captioning.utils.eval_utils as eval_utils
    import captioning.utils.opts as opts

    eval_utils.language_eval = lambda dataset, preds, preds_n, kw, split: cider_d(cfg["refs"], preds, kw, split)
    parse = opts.parse_opt

    def parse_opt() -> Any:
        args_ = parse()
        args_.device = cfg["device"]  # eval_utils.eval_split reads opt.device (default cuda); train opts lack it
        return args_

    opts.parse_opt = parse_opt
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def stub_missing() -> None:
    """train.py imports skimage.io (unused) and tensorboard's SummaryWriter (logging only); eval.py
    the raw-image loader (torchvision; used only with --image_folder)."""
    import importlib.util

    if importlib.util.find_spec("skimage") is None:
        sys.modules["skimage"] = types.ModuleType("skimage")
        sys.modules["skimage.io"] = types.ModuleType("skimage.io")
    if importlib.util.find_spec("tensorboard") is None:
        tb = types.ModuleType("torch.utils.tensorboard")
        tb.SummaryWriter = type("SummaryWriter", (), {  # type: ignore[attr-defined]
            "__init__": lambda self, *a, **k: None, "add_scalar": lambda self, *a, **k: None})
        sys.modules["torch.utils.tensorboard"] = tb
    if importlib.util.find_spec("torchvision") is None:  # eval.py imports the raw-image loader (unused here)
        raw = types.ModuleType("captioning.data.dataloaderraw")
        raw.DataLoaderRaw = None  # type: ignore[attr-defined]
        sys.modules["captioning.data.dataloaderraw"] = raw


def cider_d(refs_dir: str, preds: list[dict], kw: dict, split: str) -> dict[str, float]:
    """coco-caption's CIDEr-D of SCP's predictions: PTB-tokenised captions, df from the split's refs."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    refs = json.load(open(os.path.join(refs_dir, f"refs_{split}.json")))
    gts: dict[int, list[dict]] = {}
    for ann in refs["annotations"]:
        gts.setdefault(ann["image_id"], []).append({"caption": ann["caption"]})
    res = {p["image_id"]: [{"caption": p["caption"]}] for p in preds}
    if set(res) != set(gts):
        raise RuntimeError(f"{split}: {len(res)} predictions for {len(gts)} reference images")
    tok = PTBTokenizer()
    score, _ = Cider().compute_score(tok.tokenize(gts), tok.tokenize(res))
    out = {"CIDEr": float(score)}
    os.makedirs("eval_results", exist_ok=True)
    with open(f"eval_results/{kw['id']}_{split}.json", "w") as f:
        json.dump({"overall": out, "n_images": len(res)}, f)
    return out


# ---------------------------------------------------------------- parent: data, settings, runs
def convert(workdir: Path, out: Path, scp: Path, env: dict[str, str]) -> Path:
    """caprl's synthetic set in SCP's format (data.json, label.h5, fc/, att/, df-train-idxs.p)."""
    data = workdir / "data" / "synthetic"
    vocab = json.load(open(data / "vocab.json"))
    with h5py.File(data / "features_tinycnn.h5", "r") as f:
        made_from = f"{vocab['sha256']}:{f.attrs['annotations_sha']}"  # rebuilt when caprl's set changes
    if (out / "done").exists() and json.loads((out / "done").read_text()).get("made_from") == made_from:
        return out
    ann = json.load(open(data / "annotations.json"))
    words, max_len = vocab["idx_to_word"], int(vocab["max_length"])
    assert words[0] == "<eos>" and words[-1] == "UNK", "caprl vocab layout: 0 <eos>, UNK last"
    w2i = {w: k for k, w in enumerate(words)}
    (out / "fc").mkdir(parents=True, exist_ok=True)
    (out / "att").mkdir(exist_ok=True)
    images = ann["images"]
    json.dump({"ix_to_word": {str(k): w for k, w in enumerate(words) if k > 0},  # SCP: 1-based, 0 = end/pad
               "images": [{"split": im["split"], "id": im["id"], "file_path": im["file"]} for im in images]},
              open(out / "data.json", "w"))
    caps = [[w2i.get(w, len(words) - 1) for w in c[:max_len]] for im in images for c in im["captions"]]
    labels = np.zeros((len(caps), max_len), dtype=np.uint32)
    for r, c in enumerate(caps):
        labels[r, :len(c)] = c
    n = np.array([len(im["captions"]) for im in images])
    with h5py.File(out / "label.h5", "w") as f:
        f["labels"], f["label_length"] = labels, np.array([len(c) for c in caps], dtype=np.uint32)
        f["label_start_ix"] = np.cumsum(n) - n + 1  # 1-based, inclusive end (int64: SCP subtracts 5)
        f["label_end_ix"] = np.cumsum(n)
    with h5py.File(data / "features_tinycnn.h5", "r") as f:
        row = {int(i): k for k, i in enumerate(f["image_ids"][:])}
        pooled, regions = f["pooled"][:], f["regions"][:]
    for im in images:
        np.save(out / "fc" / f"{im['id']}.npy", pooled[row[im["id"]]])
        np.savez(out / "att" / f"{im['id']}.npz", feat=regions[row[im["id"]]])
    raw = workdir / "data" / "raw" / "synthetic" / "dataset_synthetic.json"
    run_scp(scp / "scripts" / "prepro_ngrams.py", ["--input_json", str(raw), "--dict_json", str(out / "data.json"),
            "--output_pkl", str(out / "df-train"), "--split", "train"], out, env, "prepro_ngrams")
    (out / "done").write_text(json.dumps({"made_from": made_from, "images": len(images), "fc_dim": int(pooled.shape[1]),
                                          "regions": list(regions.shape[1:])}))
    return out


def settings(params_path: Path, model: str) -> dict[str, Any]:
    """caprl's demo settings of `<m>-xe` and `<m>-scst` (options over the objectives' defaults)."""
    p = yaml.safe_load(open(params_path))
    name = CAPRL_MODEL[model]

    def run(method: str) -> dict[str, Any]:
        spec = p["runs"][f"{name}-{method}"]
        return {**p["objective_defaults"], **p["objectives"][spec["method"]], **spec.get("options", {})}

    return {"model": p["models"][name], "train": p["train"], "xe": run("xe"), "scst": run("scst"),
            "max_length": int(p["vocab"]["max_length"])}


def schedule(o: dict[str, Any]) -> list[str]:
    """A caprl rate schedule (x lr_decay_rate every lr_decay_every epochs; 0: constant) in SCP's flags."""
    every = int(o.get("lr_decay_every", 0))
    flags = ["--learning_rate", str(o["lr"]), "--learning_rate_decay_start", "0" if every else "-1"]
    return flags + (["--learning_rate_decay_every", str(every), "--learning_rate_decay_rate",
                     str(o["lr_decay_rate"])] if every else [])


def train_args(s: dict[str, Any], model: str, d: Path, fc_dim: int, ckpt: Path, run_id: str) -> list[str]:
    m, t = s["model"], s["train"]
    return ["--caption_model", model, "--input_json", str(d / "data.json"), "--input_fc_dir", str(d / "fc"),
            "--input_att_dir", str(d / "att"), "--input_label_h5", str(d / "label.h5"),
            "--cached_tokens", str(d / "df-train-idxs"), "--fc_feat_size", str(fc_dim), "--att_feat_size", str(fc_dim),
            "--input_encoding_size", str(m["embed_size"]), "--rnn_size", str(m["hidden_size"]),
            "--att_hid_size", str(m.get("att_hidden_size", m["hidden_size"])), "--drop_prob_lm", str(m["dropout"]),
            "--batch_size", str(t["batch_size"]), "--seq_per_img", "5", "--grad_clip_mode", "norm",
            "--grad_clip_value", str(t["grad_clip"]), "--max_length", str(s["max_length"]), "--beam_size", "1",
            "--save_every_epoch", "--language_eval", "1", "--val_images_use", "-1", "--id", run_id,
            "--checkpoint_path", str(ckpt)]


def run_scp(script: Path, args: list[str], cwd: Path, env: dict[str, str], log: str) -> float:
    """One SCP script in a child process of this file (patched there); its output to cwd/<log>.log."""
    cwd.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(cwd / f"{log}.log", "w") as f:
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(script), *args],
                            cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"{script.name} failed (rc {rc}): see {cwd / (log + '.log')}")
    return time.time() - t0


def curve(ckpt: Path, run_id: str, first_epoch: int, epochs: int) -> dict[str, Any]:
    """SCP's per-epoch validation record (histories_<id>.pkl); train.py swallows RuntimeErrors, so
    an incomplete record is an error here."""
    hist = pickle.load(open(ckpt / f"histories_{run_id}.pkl", "rb"))["val_result_history"]
    its = sorted(hist)
    if len(its) != epochs:
        raise SystemExit(f"{ckpt}: {len(its)} validations for {epochs} epochs; see the train log there")
    cider = [round(hist[i]["lang_stats"]["CIDEr"], 4) for i in its]
    return {"epochs": list(range(first_epoch + 1, first_epoch + epochs + 1)), "iterations": its,
            "val_cider_d": cider, "val_loss": [round(float(hist[i]["loss"]), 4) for i in its]}


def best_epoch(ckpt: Path, run_id: str) -> tuple[int, float]:
    infos = pickle.load(open(ckpt / f"infos_{run_id}-best.pkl", "rb"))
    return int(infos["epoch"]), float(infos["best_val_score"])


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, required=True, help="caprl workflow dir holding data/synthetic")
    ap.add_argument("--scp", type=Path, default=Path("/tmp/scp"), help="extracted scp_py.tgz")
    ap.add_argument("--scp-tools", type=Path, default=PEERS / "scp_tools", help="SCP's tools/train.py, eval.py")
    ap.add_argument("--shims", type=Path, default=PEERS / "shims", help="the lmdbdict stand-in")
    ap.add_argument("--params", type=Path, default=REPO / "params.yaml", help="caprl's demo settings")
    ap.add_argument("--model", choices=sorted(CAPRL_MODEL), default="newfc")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--xe-epochs", type=int)
    ap.add_argument("--scst-epochs", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rundir", type=Path, help="SCP's checkpoints and logs (default WORKDIR/scp_runs/MODEL-seedK)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    workdir = a.workdir.resolve()
    rundir = (a.rundir or workdir / "scp_runs" / f"{a.model}-seed{a.seed}").resolve()
    cfg = {"scp": str(a.scp.resolve()), "shims": str(a.shims.resolve()), "seed": a.seed, "threads": a.threads,
           "device": a.device, "refs": str(workdir / "data" / "synthetic")}
    env = {**os.environ, "SCP_HARNESS": json.dumps(cfg), "OMP_NUM_THREADS": str(a.threads),
           "MKL_NUM_THREADS": str(a.threads), "PYTHONUNBUFFERED": "1"}
    data = convert(workdir, workdir / "scp_data", a.scp, env)
    fc_dim = json.loads((data / "done").read_text())["fc_dim"]
    s = settings(a.params, a.model)
    xe_n, sc_n = a.xe_epochs or int(s["xe"]["epochs"]), a.scst_epochs or int(s["scst"]["epochs"])
    for sub in ("xe", "scst", "scst_start", "eval"):  # train.py resumes from whatever it finds there
        shutil.rmtree(rundir / sub, ignore_errors=True)
    xe_dir, sc_dir, start = rundir / "xe", rundir / "scst", rundir / "scst_start"
    xe = s["xe"]
    xe_args = train_args(s, a.model, data, fc_dim, xe_dir, "xe") + schedule(xe) + [
        "--max_epochs", str(xe_n), "--scheduled_sampling_start", str(xe.get("ss_start", -1)),
        "--scheduled_sampling_increase_every", str(xe.get("ss_increase_every", 5)),
        "--scheduled_sampling_increase_prob", str(xe.get("ss_increase_prob", 0.05)),
        "--scheduled_sampling_max_prob", str(xe.get("ss_max_prob", 0.25))]
    xe_s = run_scp(a.scp_tools / "train.py", xe_args, xe_dir, env, "train")
    e_best, xe_score = best_epoch(xe_dir, "xe")
    # SCST from the best XE epoch: its weights and infos (epoch counter, best val score: the start
    # competes for the best SCST checkpoint, as caprl's epoch 0); no optimizer.pth: a fresh Adam, as caprl
    start.mkdir(parents=True)
    shutil.copy(xe_dir / "model-best.pth", start / "model.pth")
    shutil.copy(xe_dir / "infos_xe-best.pkl", start / "infos_scst.pkl")
    sc = s["scst"]
    if float(sc.get("entropy", 0)) != 0 or sc.get("reward", "cider_d") != "cider_d":
        raise SystemExit("caprl's scst options use an entropy term or a reward SCP's SCST lacks here")
    sc_args = train_args(s, a.model, data, fc_dim, sc_dir, "scst") + schedule(sc) + [
        "--start_from", str(start), "--self_critical_after", str(e_best), "--max_epochs", str(e_best + sc_n),
        "--train_sample_n", str(sc["n_samples"]), "--train_sample_method", "sample", "--sc_sample_method", "greedy",
        "--temperature", str(sc.get("temperature", 1.0)), "--cider_reward_weight", "1", "--bleu_reward_weight", "0"]
    sc_s = run_scp(a.scp_tools / "train.py", sc_args, sc_dir, env, "train")
    improved = (sc_dir / "model-best.pth").exists()
    ck_dir, ck_id = (sc_dir, "scst") if improved else (xe_dir, "xe")
    test: dict[str, Any] = {"checkpoint": str(ck_dir / "model-best.pth"), "scst_beat_xe_on_val": improved}
    ev_s = 0.0
    for name, beam in (("greedy", 1), ("beam5", 5)):
        ev_s += run_scp(a.scp_tools / "eval.py", [
            "--model", str(ck_dir / "model-best.pth"), "--infos_path", str(ck_dir / f"infos_{ck_id}-best.pkl"),
            "--split", "test", "--beam_size", str(beam), "--max_length", str(s["max_length"]), "--language_eval", "1",
            "--device", a.device, "--num_images", "-1", "--dump_images", "0", "--dump_json", "0",
            "--verbose_beam", "0", "--force", "1", "--id", f"test_{name}"], rundir / "eval", env, f"eval_{name}")
        test[name] = round(json.load(open(rundir / "eval" / "eval_results" / f"test_{name}_test.json"))
                           ["overall"]["CIDEr"], 4)
    sc_curve = curve(sc_dir, "scst", e_best, sc_n)
    result = {"impl": "self-critical.pytorch 4c48a33 tools/train.py", "model": a.model, "seed": a.seed,
              "device": a.device, "threads": a.threads, "caprl_settings": s, "neutralised": NEUTRALISED,
              "xe": {**curve(xe_dir, "xe", 0, xe_n), "best_epoch": e_best, "best_val_cider_d": round(xe_score, 4),
                     "seconds": round(xe_s, 1), "args": xe_args},
              "scst": {**sc_curve, "best_epoch": best_epoch(sc_dir, "scst")[0] if improved else e_best,
                       "seconds": round(sc_s, 1), "args": sc_args},
              "test": {**test, "seconds": round(ev_s, 1)}, "rundir": str(rundir)}
    a.out.write_text(json.dumps(result, indent=1))
    table(result)


def table(r: dict[str, Any]) -> None:
    print(f"SCP {r['model']} seed {r['seed']}: val CIDEr-D (greedy) per epoch")
    for stage in ("xe", "scst"):
        row = " ".join(f"{e}:{c:.3f}" for e, c in zip(r[stage]["epochs"], r[stage]["val_cider_d"]))
        print(f"  {stage:4s} ({r[stage]['seconds']:.0f} s, best epoch {r[stage]['best_epoch']}) {row}")
    t = r["test"]
    print(f"  test CIDEr-D of {t['checkpoint']}: greedy {t['greedy']:.4f}, beam 5 {t['beam5']:.4f}")


if __name__ == "__main__":
    main()
