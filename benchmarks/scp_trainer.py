"""Run self-critical.pytorch's (SCP) OWN trainer on caprl's synthetic set: XE, then SCST and NSC each
from the best XE epoch, with the settings of caprl's demo runs of the same model (`fc-xe` ->
`fc-scst`; `topdown-xe` -> `topdown-scst`, `topdown-nsc`; `transformer-xe` -> `transformer-scst`,
`transformer-nsc`), so that the two trainers can be compared side by side (validation curves; test
CIDEr-D of the best checkpoints). Reference harness only: it drives SCP's `tools/train.py` and
`tools/eval.py` (commit 4c48a33, MIT licence) from outside, in subprocesses of this script, and never
copies SCP code into the project.

Set-up, once per machine (SCP's sources from the peers folder; pycocoevalcap and Java for CIDEr-D):
  mkdir -p /tmp/scp && tar -xzf /work/shared/peers/self-critical.pytorch/scp_py.tgz -C /tmp/scp
  pip install yacs
The caprl data (scst_parity.py builds it: WORKDIR/data holds data/synthetic, the same files as here):
  CAPRL_PARAMS_SCHEMA=$PWD/workflow/schemas/params.schema.yaml snakemake -s $PWD/Snakefile \
    --directory DIR --cores 1 \
    data/synthetic/{features_tinycnn.h5,vocab.json,annotations.json,refs_val.json,refs_test.json}
Run (1 thread; --xe-epochs/--scst-epochs shorten a smoke run; --scst-epochs sets SCST's and NSC's):
  OMP_NUM_THREADS=1 python benchmarks/scp_trainer.py --workdir DIR --scp /tmp/scp --seed 1 --out results.json
    [--model newfc|updown|transformer] [--methods scst nsc] [--xe-epochs N --scst-epochs M] [--rundir RUNS]
    [--resume]
--methods defaults to those of the model's demo runs in params.yaml (newfc: scst; updown and
transformer: scst, nsc). --resume keeps a finished stage (XE, SCST, NSC: its `done.json` with the
same SCP arguments) instead of retraining it.

What it does: converts the set to SCP's format (DIR/scp_data: caprl's vocabulary, split, captions
clipped to 16 tokens and features; the CIDEr-D df by SCP's scripts/prepro_ngrams.py over train),
trains XE with SCP's tools/train.py (validation every epoch: greedy, all val images; SCP keeps the
best by val CIDEr), then each RL method from the best XE epoch's model and infos (epoch counter and
best val score carried on, so the start competes for the best RL checkpoint) and, where the caprl
run's `init_optimizer` is carry (caprl's default, SCP's --start_from practice: caprl's Adam moments
from the XE run's best.pt), that epoch's Adam state (optimizer-best.pth as the start's
optimizer.pth; fresh, or a params.yaml without the option: none, a new Adam), and scores the best
XE checkpoint and each method's best checkpoint on test with SCP's tools/eval.py (greedy, and beam
search of params.yaml's decode.beam_size).
Writes --out: per stage (xe, scst, nsc) the per-epoch val CIDEr-D, the chosen epoch, the wall time
(seconds, seconds_per_epoch: training plus the per-epoch validation) and the test scores
(`test.greedy`, `test.beam<k>`: coco-caption's CIDEr-D, a fraction).

The methods in SCP's options (tools/train.py, captioning/modules/loss_wrapper.py, losses.py):
* SCST (caprl `baseline: greedy`): `--self_critical_after E --sc_sample_method greedy
  --train_sample_method sample --train_sample_n 5`: 5 samples per image in train mode, the greedy
  caption (eval mode: caprl's `greedy_mode` must be eval) as baseline
  (rewards.get_self_critical_reward), RewardCriterion.
* NSC (caprl `baseline: nsc`, Luo 2020): `--structure_after E --structure_loss_weight 1
  --structure_loss_type new_self_critical --train_sample_method sample --train_sample_n 5`
  (`--self_critical_after -1`): the structure-loss branch, no greedy decode, each sample's CIDEr-D
  minus the mean of its image's other 4 samples, the loss a masked mean over the tokens
  (StructureLosses 'new_self_critical'), as SCP's NSC configs (updown_nsc.yml, transformer_nscl.yml:
  configs/recipes/ cite them). structure_loss_weight 1: no XE term mixed in.
  Both: E = the best XE epoch (SCP's RL starts at that epoch count, as its copy_model.sh practice),
  `--max_epochs E + epochs`, `--cider_reward_weight 1 --bleu_reward_weight 0` (CIDEr-D with the
  end token: caprl's rewards.cider_d eos true). caprl's `temperature` (1.0) and `entropy` (0) have no
  SCP counterpart in training (its train-time sampler runs at temperature 1; no entropy term): any
  other value stops the run.

Mappings of caprl's params.yaml (the run's options over objectives.<method> over objective_defaults;
models.<name>; train; decode) to SCP's options:
* all models: lr -> --learning_rate; lr_decay_every / lr_decay_rate -> --learning_rate_decay_start 0
  / _every / _rate (0: constant, decay_start -1); adam_beta1 / adam_beta2 / adam_eps -> --optim adam
  --optim_alpha / --optim_beta / --optim_epsilon (no --noamopt, no --reduce_on_plateau: SCP's plain
  Adam; caprl's `lr_schedule` must be step, the demo's for every model); train.batch_size ->
  --batch_size (images; --seq_per_img 5: each image's 5 captions in XE, as caprl's XE reads every
  caption of a synthetic image, 5); train.grad_clip -> --grad_clip_mode norm --grad_clip_value;
  vocab.max_length -> --max_length; objectives.xe ss_* -> --scheduled_sampling_* (off: -1);
  n_samples -> --train_sample_n; epochs -> --max_epochs; decode.beam_size / max_length /
  suppress_unk / block_trigrams / remove_bad_endings -> eval.py's --beam_size / --max_length /
  --suppress_UNK / --block_trigrams / --remove_bad_endings (SCP's beam search suppresses UNK by
  default, --suppress_UNK 1; caprl's demo does not: passed 0); other decode options (length
  penalty, diverse groups) must be off.
* newfc (caprl fc, cell maxout = SCP's LSTMCore): embed_size -> --input_encoding_size, hidden_size ->
  --rnn_size, dropout -> --drop_prob_lm.
* updown (caprl topdown; SCP's UpDownModel, AttModel.py): embed_size -> --input_encoding_size,
  hidden_size -> --rnn_size, att_hidden_size -> --att_hid_size, dropout -> --drop_prob_lm.
* transformer (caprl transformer; SCP's TransformerModel.py): SCP's transformer keys through its own
  `--cfg` YAML (written to RUNDIR/transformer.yml, as its configs/transformer/transformer.yml sets
  them; opts.py has no flags for them): num_layers -> N_enc = N_dec, d_model -> d_model, heads ->
  num_att_heads, d_ff -> d_ff, dropout -> dropout (attention weights, feed-forward, residuals,
  positions); feat_dropout -> --drop_prob_lm (SCP's att_embed dropout, on the embedded regions);
  also --num_layers L, --input_encoding_size d_model and --rnn_size d_ff (TransformerModel's
  fallbacks for the same keys; train.py checks num_layers and rnn_size on resume). No --noamopt:
  the demo's transformer runs use lr_schedule step at a constant rate (transformer-xe 3e-3, ~720
  steps, far below Noam's 20,000-step warm-up); SCP's plain Adam at the same rate.
Differences left (none removable from outside SCP's code or caprl's params):
* updown against caprl's topdown: SCP's word embedding is Embedding -> ReLU -> Dropout, its region
  embedding Linear -> ReLU -> Dropout, and its attention LSTM reads a separate embedding of the
  pooled vector (fc_embed: Linear -> ReLU -> Dropout of the fc feature, here the tinycnn pooled
  channels); caprl's topdown has no ReLU or dropout on the word embedding, no dropout on the
  regions, and feeds the mean of the embedded regions (Anderson et al.'s v-bar) instead of the
  pooled vector. Both: dropout before the output layer only (plus SCP's three above).
* transformer: SCP's LayerNorm divides by the unbiased standard deviation + 1e-6, caprl's (torch's)
  by sqrt(biased variance + 1e-6): at d_model 64 a factor ~sqrt(64/63) that the gains absorb; SCP's
  decoder re-reads the whole prefix every step, caprl's caches keys and values (the same numbers).
* SCP counts an epoch when its sampler wraps, one batch late: its epoch 1 is 25 batches, then 24
  (caprl: 24 each, 1,200 images at 50). SCP validates on val with greedy decoding; caprl with
  train.validate_with (scst_parity.py's commands set greedy).
* SCP's data loader draws its own batches: the same seed number is not the same batch order or
  initialisation as caprl's; seeds pair XE with its RL runs within one trainer only.

Neutralised from outside SCP's code (in the child processes only): `.cuda()` and
`torch.cuda.synchronize` (CPU), DataLoader workers and pinned memory (num_workers=4 hard-coded), the
unused `skimage` / tensorboard / torchvision (eval.py's raw-image loader) imports where missing, and
`eval_utils.language_eval` (coco-caption's COCO annotation files, METEOR and SPICE) by CIDEr-D alone:
pycocoevalcap's PTB tokenizer + Cider on caprl's data/synthetic/refs_<split>.json, as coco-caption
scores it. SCP has no seed option: the child seeds random, numpy and torch (reruns are identical).
"""
from __future__ import annotations

import argparse
import fcntl
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
from typing import Any, Callable

import h5py
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
PEERS = Path("/work/shared/peers/self-critical.pytorch")
CAPRL_MODEL = {"newfc": "fc", "updown": "topdown", "transformer": "transformer"}  # SCP caption_model -> caprl's name
METHODS = ("scst", "nsc")  # caprl's runs <model>-scst, <model>-nsc; the SCP side of each: rl_args
NEUTRALISED = ["Module.cuda/Tensor.cuda -> no-op on cpu", "torch.cuda.synchronize -> no-op on cpu",
               "torch DataLoader: num_workers=0, pin_memory=False",
               "skimage, tensorboard, eval.py's dataloaderraw (torchvision) stubbed where missing",
               "eval_utils.language_eval -> CIDEr-D only (pycocoevalcap PTBTokenizer + Cider, caprl refs_<split>)",
               "seeds: random, numpy, torch set before SCP's script runs"]
TRANSFORMER_CFG = {"N_enc": "num_layers", "N_dec": "num_layers", "d_model": "d_model", "num_att_heads": "heads",
                   "d_ff": "d_ff", "dropout": "dropout"}  # SCP's --cfg key -> caprl's models.transformer key


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
    """caprl's synthetic set in SCP's format, once: concurrent runs on one workdir wait for the first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "scp_data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return convert_locked(workdir, out, scp, env)


def convert_locked(workdir: Path, out: Path, scp: Path, env: dict[str, str]) -> Path:
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
    """caprl's demo settings of `<m>-xe`, `<m>-scst` and `<m>-nsc` (where params.yaml has them): each
    run's options over its objective's over objective_defaults."""
    p = yaml.safe_load(open(params_path))
    name = CAPRL_MODEL[model]

    def run(run_name: str) -> dict[str, Any]:
        spec = p["runs"][run_name]
        return {"run": run_name, "method": spec["method"],
                **p["objective_defaults"], **p["objectives"][spec["method"]], **spec.get("options", {})}

    rl = {m: run(f"{name}-{m}") for m in METHODS if f"{name}-{m}" in p["runs"]}
    for m, o in rl.items():
        if o["method"] != "scst" or o.get("baseline", "greedy") != {"scst": "greedy", "nsc": "nsc"}[m]:
            raise SystemExit(f"{o['run']}: method {o['method']}, baseline {o.get('baseline')}: "
                             f"not the {m} this harness maps to SCP")
    return {"model": p["models"][name], "train": p["train"], "xe": run(f"{name}-xe"), **rl, "methods": list(rl),
            "max_length": int(p["vocab"]["max_length"]), "decode": p["decode"], "rewards": p["rewards"]}


def optimiser(o: dict[str, Any]) -> list[str]:
    """A caprl rate schedule (x lr_decay_rate every lr_decay_every epochs; 0: constant) and Adam's
    constants in SCP's flags: its plain Adam (no --noamopt, no --reduce_on_plateau)."""
    if o.get("lr_schedule", "step") != "step":
        raise SystemExit(f"{o['run']}: lr_schedule {o['lr_schedule']}: only caprl's step schedule is mapped "
                         "(SCP's --noamopt fixes Adam at 0.9, 0.98, 1e-9)")
    every = int(o.get("lr_decay_every", 0))
    flags = ["--learning_rate", str(o["lr"]), "--learning_rate_decay_start", "0" if every else "-1"]
    flags += ["--learning_rate_decay_every", str(every), "--learning_rate_decay_rate",
              str(o["lr_decay_rate"])] if every else []
    return flags + ["--optim", "adam", "--optim_alpha", str(o.get("adam_beta1", 0.9)),
                    "--optim_beta", str(o.get("adam_beta2", 0.999)), "--optim_epsilon", str(o.get("adam_eps", 1e-8))]


def model_args(m: dict[str, Any], model: str, rundir: Path) -> list[str]:
    """caprl's models.<name> sizes in SCP's options (the docstring's mapping)."""
    if model == "transformer":
        cfg = rundir / "transformer.yml"  # SCP's own --cfg route, as configs/transformer/transformer.yml
        cfg.write_text(yaml.safe_dump({k: m[v] for k, v in TRANSFORMER_CFG.items()}, sort_keys=False))
        return ["--cfg", str(cfg), "--num_layers", str(m["num_layers"]), "--input_encoding_size", str(m["d_model"]),
                "--rnn_size", str(m["d_ff"]), "--drop_prob_lm", str(m["feat_dropout"])]
    if model == "newfc" and (m.get("cell", "maxout") != "maxout" or m.get("image", "input") != "input"):
        raise SystemExit(f"models.fc: cell {m.get('cell')}, image {m.get('image')}: SCP's newfc is the maxout "
                         "cell (LSTMCore) reading the image as its first input")
    return ["--input_encoding_size", str(m["embed_size"]), "--rnn_size", str(m["hidden_size"]),
            "--att_hid_size", str(m.get("att_hidden_size", m["hidden_size"])), "--drop_prob_lm", str(m["dropout"])]


def train_args(s: dict[str, Any], model: str, d: Path, fc_dim: int, ckpt: Path, run_id: str,
               rundir: Path) -> list[str]:
    t = s["train"]
    return ["--caption_model", model, "--input_json", str(d / "data.json"), "--input_fc_dir", str(d / "fc"),
            "--input_att_dir", str(d / "att"), "--input_label_h5", str(d / "label.h5"),
            "--cached_tokens", str(d / "df-train-idxs"), "--fc_feat_size", str(fc_dim), "--att_feat_size", str(fc_dim),
            *model_args(s["model"], model, rundir),
            "--batch_size", str(t["batch_size"]), "--seq_per_img", "5", "--grad_clip_mode", "norm",
            "--grad_clip_value", str(t["grad_clip"]), "--max_length", str(s["max_length"]), "--beam_size", "1",
            "--save_every_epoch", "--language_eval", "1", "--val_images_use", "-1", "--id", run_id,
            "--checkpoint_path", str(ckpt)]


def rl_args(o: dict[str, Any], rewards: dict[str, Any], e_best: int, epochs: int) -> list[str]:
    """caprl's scst run (greedy or nsc baseline) as SCP's SCST or structure-loss NSC, from epoch e_best."""
    reward = rewards.get(o.get("reward", "cider_d"), {})
    if float(o.get("entropy", 0)) != 0 or reward.get("kind") != "cider_d" or not reward.get("eos", False):
        raise SystemExit(f"{o['run']}: an entropy term or a reward other than CIDEr-D with the end token (SCP's)")
    if float(o.get("temperature", 1.0)) != 1.0:
        raise SystemExit(f"{o['run']}: temperature {o['temperature']}: SCP's train-time sampler runs at 1")
    if o.get("baseline", "greedy") == "greedy" and o.get("greedy_mode", "eval") != "eval":
        raise SystemExit(f"{o['run']}: greedy_mode {o['greedy_mode']}: SCP decodes the greedy baseline in eval mode")
    if o.get("init_optimizer", "fresh") not in ("fresh", "carry"):
        raise SystemExit(f"{o['run']}: init_optimizer {o['init_optimizer']}: not mapped")
    if o.get("baseline", "greedy") == "greedy":
        method = ["--self_critical_after", str(e_best), "--sc_sample_method", "greedy"]
    else:  # nsc: SCP's structure loss new_self_critical, alone
        method = ["--self_critical_after", "-1", "--structure_after", str(e_best), "--structure_loss_weight", "1",
                  "--structure_loss_type", "new_self_critical"]
    return method + ["--max_epochs", str(e_best + epochs), "--train_sample_n", str(o["n_samples"]),
                     "--train_sample_method", "sample", "--cider_reward_weight", "1", "--bleu_reward_weight", "0"]


def decode_args(dec: dict[str, Any]) -> list[str]:
    """params.yaml's decode options in eval.py's flags (beam size apart); the ones SCP lacks must be off."""
    if dec.get("length_penalty", "none") != "none" or int(dec.get("groups", 1)) != 1:
        raise SystemExit("decode: a length penalty or diverse groups: not mapped to SCP's eval.py here")
    return ["--max_length", str(dec["max_length"]), "--suppress_UNK", str(int(bool(dec.get("suppress_unk")))),
            "--block_trigrams", str(int(bool(dec.get("block_trigrams")))),
            "--remove_bad_endings", str(int(bool(dec.get("remove_bad_endings"))))]


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


def test_scores(ck_dir: Path, ck_id: str, stage: str, dec: dict[str, Any], device: str, rundir: Path,
                env: dict[str, str]) -> dict[str, Any]:
    """SCP's eval.py on test of a stage's best checkpoint: greedy, and beam search of decode.beam_size."""
    beam = int(dec["beam_size"])
    out: dict[str, Any] = {"checkpoint": str(ck_dir / "model-best.pth")}
    started = time.time()
    for name, width in (("greedy", 1), (f"beam{beam}", beam)):
        run_id = f"{stage}_{name}"
        run_scp(Path(env["SCP_TOOLS"]) / "eval.py", [
            "--model", str(ck_dir / "model-best.pth"), "--infos_path", str(ck_dir / f"infos_{ck_id}-best.pkl"),
            "--split", "test", "--beam_size", str(width), *decode_args(dec), "--language_eval", "1",
            "--device", device, "--num_images", "-1", "--dump_images", "0", "--dump_json", "0",
            "--verbose_beam", "0", "--force", "1", "--id", run_id], rundir / "eval", env, f"eval_{run_id}")
        out[name] = round(json.load(open(rundir / "eval" / "eval_results" / f"{run_id}_test.json"))
                          ["overall"]["CIDEr"], 4)
    out["seconds"] = round(time.time() - started, 1)
    return out


def train_stage(script: Path, args: list[str], ckpt: Path, env: dict[str, str], resume: bool,
                prepare: Callable[[], None] | None = None, key: dict[str, Any] | None = None) -> float:
    """One train.py run into ckpt (its checkpoints, train.log, done.json); with resume, a finished run
    with the same arguments (and key: what else made it) is kept. train.py resumes from whatever it
    finds there: wiped first."""
    done, made = ckpt / "done.json", {"args": args, **(key or {})}
    if resume and done.exists() and {k: v for k, v in json.loads(done.read_text()).items() if k != "seconds"} == made:
        return float(json.loads(done.read_text())["seconds"])
    shutil.rmtree(ckpt, ignore_errors=True)
    if prepare is not None:
        prepare()
    seconds = run_scp(script, args, ckpt, env, "train")
    done.write_text(json.dumps({**made, "seconds": seconds}))
    return seconds


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
    ap.add_argument("--methods", nargs="+", choices=METHODS, help="RL methods (default: the model's demo runs)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--xe-epochs", type=int)
    ap.add_argument("--scst-epochs", type=int, help="epochs of every RL method (SCST, NSC)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rundir", type=Path, help="SCP's checkpoints and logs (default WORKDIR/scp_runs/MODEL-seedK)")
    ap.add_argument("--resume", action="store_true", help="keep finished stages trained with the same arguments")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    workdir = a.workdir.resolve()
    rundir = (a.rundir or workdir / "scp_runs" / f"{a.model}-seed{a.seed}").resolve()
    cfg = {"scp": str(a.scp.resolve()), "shims": str(a.shims.resolve()), "seed": a.seed, "threads": a.threads,
           "device": a.device, "refs": str(workdir / "data" / "synthetic")}
    env = {**os.environ, "SCP_HARNESS": json.dumps(cfg), "OMP_NUM_THREADS": str(a.threads),
           "MKL_NUM_THREADS": str(a.threads), "PYTHONUNBUFFERED": "1", "SCP_TOOLS": str(a.scp_tools.resolve())}
    s = settings(a.params, a.model)
    methods = a.methods or s["methods"]
    if any(m not in s for m in methods):
        raise SystemExit(f"params.yaml has no {CAPRL_MODEL[a.model]}-<method> run for {methods}")
    data = convert(workdir, workdir / "scp_data", a.scp, env)
    fc_dim = json.loads((data / "done").read_text())["fc_dim"]
    rundir.mkdir(parents=True, exist_ok=True)
    for sub in ("scst_start", "eval"):  # the earlier layout's; eval is rewritten every time
        shutil.rmtree(rundir / sub, ignore_errors=True)
    train, dec = a.scp_tools / "train.py", s["decode"]
    xe, xe_dir = s["xe"], rundir / "xe"
    xe_n = a.xe_epochs or int(xe["epochs"])
    xe_args = train_args(s, a.model, data, fc_dim, xe_dir, "xe", rundir) + optimiser(xe) + [
        "--max_epochs", str(xe_n), "--scheduled_sampling_start", str(xe.get("ss_start", -1)),
        "--scheduled_sampling_increase_every", str(xe.get("ss_increase_every", 5)),
        "--scheduled_sampling_increase_prob", str(xe.get("ss_increase_prob", 0.05)),
        "--scheduled_sampling_max_prob", str(xe.get("ss_max_prob", 0.25))]
    xe_s = train_stage(train, xe_args, xe_dir, env, a.resume)
    e_best, xe_score = best_epoch(xe_dir, "xe")
    result: dict[str, Any] = {
        "impl": "self-critical.pytorch 4c48a33 tools/train.py", "model": a.model, "caprl_model": CAPRL_MODEL[a.model],
        "seed": a.seed, "device": a.device, "threads": a.threads, "methods": methods, "caprl_settings": s,
        "neutralised": NEUTRALISED, "rundir": str(rundir),
        "xe": {**curve(xe_dir, "xe", 0, xe_n), "best_epoch": e_best, "best_val_cider_d": round(xe_score, 4),
               "seconds": round(xe_s, 1), "seconds_per_epoch": round(xe_s / xe_n, 1), "args": xe_args,
               "test": test_scores(xe_dir, "xe", "xe", dec, a.device, rundir, env)}}
    a.out.write_text(json.dumps(result, indent=1))
    for m in methods:
        o, rl_dir, start = s[m], rundir / m, rundir / f"{m}_start"
        n = a.scst_epochs or int(o["epochs"])

        carry = o.get("init_optimizer", "fresh") == "carry"

        def prepare(m: str = m, start: Path = start, carry: bool = carry) -> None:
            # the best XE epoch's weights and infos (epoch counter, best val score: the start competes
            # for the best checkpoint, as caprl's epoch 0); its Adam state (optimizer-best.pth) where
            # caprl's init_optimizer is carry, else none: a fresh Adam
            shutil.rmtree(start, ignore_errors=True)
            start.mkdir(parents=True)
            shutil.copy(xe_dir / "model-best.pth", start / "model.pth")
            shutil.copy(xe_dir / "infos_xe-best.pkl", start / f"infos_{m}.pkl")
            if carry:
                shutil.copy(xe_dir / "optimizer-best.pth", start / "optimizer.pth")

        args = (train_args(s, a.model, data, fc_dim, rl_dir, m, rundir) + optimiser(o) + ["--start_from", str(start)]
                + rl_args(o, s["rewards"], e_best, n))
        secs = train_stage(train, args, rl_dir, env, a.resume, prepare,
                           key={"init_optimizer": o.get("init_optimizer", "fresh")})
        improved = (rl_dir / "model-best.pth").exists()  # else no RL epoch beat the XE start on val
        result[m] = {**curve(rl_dir, m, e_best, n), "best_epoch": best_epoch(rl_dir, m)[0] if improved else e_best,
                     "beat_xe_on_val": improved, "init_optimizer": o.get("init_optimizer", "fresh"),
                     "seconds": round(secs, 1), "seconds_per_epoch": round(secs / n, 1), "args": args,
                     "test": (test_scores(rl_dir, m, m, dec, a.device, rundir, env) if improved
                              else result["xe"]["test"])}
        a.out.write_text(json.dumps(result, indent=1))
    table(result)


def table(r: dict[str, Any]) -> None:
    print(f"SCP {r['model']} seed {r['seed']}: val CIDEr-D (greedy) per epoch; test CIDEr-D of the best checkpoint")
    for stage in ("xe", *r["methods"]):
        st = r[stage]
        row = " ".join(f"{e}:{c:.3f}" for e, c in zip(st["epochs"], st["val_cider_d"]))
        test = ", ".join(f"{k} {v:.4f}" for k, v in st["test"].items() if k not in ("checkpoint", "seconds"))
        print(f"  {stage:4s} ({st['seconds']:.0f} s, {st['seconds_per_epoch']:.0f} s/epoch, best epoch "
              f"{st['best_epoch']}) {row}\n       test: {test}")


if __name__ == "__main__":
    main()
