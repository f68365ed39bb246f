"""What dropping ended rows from a CPU decode gains (caprl.decoding.live_rows), on a finished main run's models.

    python benchmarks/live_rows.py [--workdir .] [--runs fc-scst topdown-scst fc_lstm-pg_spider-cider_d]
                                   [--steps 8] [--rounds 2]

Needs the README's main command's outputs under ``--workdir`` (the synthetic set and the runs'
best checkpoints): a trained model's captions end where the data's do (~8 words of 16 steps),
which random weights do not show. For each run, its method's loss and backward on the first
``--steps`` train batches, with ended rows dropped (``SHRINK_AT`` 0.75, the default) and with every
row stepped (``SHRINK_AT`` -1), alternated ``--rounds`` times in one process, 1 thread; the best
round of each is reported, with the largest difference of their losses.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from caprl import decoding, params as params_mod
from caprl.models import checkpoint
from caprl.decoding import live_rows
from caprl.data.loader import CaptionData, DataPaths, Loading
from caprl.objectives import ObjectiveEnv, build_objective
from caprl.rewards import build_reward, load_document_frequencies


def timed(objective, model, data, ids, batch: int, steps: int) -> tuple[float, list[float]]:
    torch.manual_seed(0)
    model.train()
    started, losses = time.perf_counter(), []
    for k in range(steps):
        b = data.batch(ids[k * batch:(k + 1) * batch], regions=model.reads_regions)
        b.noise = decoding.Noise(0, k, total=len(b.image_ids))
        loss, _ = objective.loss(model, b)
        loss.backward()
        model.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return time.perf_counter() - started, losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("."))
    p.add_argument("--runs", nargs="+", default=["fc-scst", "topdown-scst", "fc_lstm-pg_spider-cider_d"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    w = a.workdir / "data" / "synthetic"
    params = params_mod.load(a.workdir / "params.yaml")
    data = CaptionData(DataPaths(str(w / "annotations.json"), str(w / "vocab.json"), str(w / "labels.h5"),
                                 str(w / "features_tinycnn.h5")), Loading(in_memory=True))
    reward = build_reward("cider_d", data.references("train"), load_document_frequencies(str(w / "cider_df.json")))
    env = ObjectiveEnv(decode_words=data.decode, reward=lambda _name: reward,
                       max_length=params["decode"]["max_length"])
    ids, batch = data.split_ids("train"), params["train"]["batch_size"]
    print("| run | method | ended rows dropped s | every row stepped s | ratio | largest loss difference |")
    print("|---|---|---:|---:|---:|---:|")
    for run in a.runs:
        spec = params_mod.run_spec(params, run)
        model = checkpoint.model_from_checkpoint(checkpoint.load(a.workdir / "runs" / "synthetic" / run / "best.pt"))
        objective = build_objective(spec.method, dict(spec.options), env, model)
        best: dict[bool, tuple[float, list[float]]] = {}
        for _ in range(a.rounds):
            for on in (False, True):
                live_rows.SHRINK_AT = 0.75 if on else -1.0
                t, losses = timed(objective, model, data, ids, batch, a.steps)
                if on not in best or t < best[on][0]:
                    best[on] = (t, losses)
        diff = max(abs(x - y) for x, y in zip(best[True][1], best[False][1]))
        print(f"| {run} | {spec.method} | {best[True][0]:.2f} | {best[False][0]:.2f} | "
              f"{best[False][0] / best[True][0]:.2f}x | {diff:.1e} |", flush=True)
    live_rows.SHRINK_AT = 0.75


if __name__ == "__main__":
    main()
