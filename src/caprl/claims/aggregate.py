"""Aggregate comparisons of a paper's methods over its seeds, datasets and metrics with rliable
(Agarwal et al., NeurIPS 2021, "Deep RL at the edge of the statistical precipice"; google-research/rliable
1.2.0: ``metrics.aggregate_iqm``, ``library.get_interval_estimates``, and
``metrics.probability_of_improvement``'s formula, vectorised here: :func:`probability_of_improvement`): the interquartile mean of each compared run's normalised scores
with its stratified-bootstrap 95% interval, and the probability that the claim's run ``a`` improves on
its run ``b`` (P(a > b) per task, averaged over the tasks) with its interval.

A task is one metric on one dataset (``<dataset>/<metric>`` of the runs' score files: BLEU-1..4,
CIDEr-D, ...); a task's scores are divided by their mean over the compared runs and seeds (1 = the
paper's average run), so that CIDEr-D's scale does not outweigh BLEU-4's. The runs are those the
claims compare by name; a paper whose claims read only table cells (paper 004: methods at matched
operating points, not runs) has no run-level aggregate, said so. Bootstrap: 2,000 replications,
seeded by the config's first seed, so the same scores give the same intervals.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from caprl import io

REPS = 2000


def compared_runs(config: dict[str, Any]) -> list[str]:
    """The ``<dataset>/<run>`` sides of the (bound) config's claims, in their order."""
    return list(dict.fromkeys(c[side] for c in config["claims"] for side in ("a", "b") if isinstance(c[side], str)))


def score_matrices(per_seed: dict[Any, dict[str, Any]], runs: list[str]) -> tuple[list[str], dict[str, np.ndarray]]:
    """The tasks (metrics every run has a number for in every seed) and run -> (seeds x tasks) of its
    normalised scores (each task over its mean across runs and seeds)."""
    seeds = sorted(per_seed)
    common: set[str] | None = None
    for seed in seeds:
        for run in runs:
            metrics = per_seed[seed]["runs"].get(run, {}).get("metrics", {})
            have = {k for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
            common = have if common is None else common & have
    names = sorted(common or ())
    tasks = [f"{runs[0].split('/', 1)[0]}/{name}" for name in names]  # a paper's claims bind to one dataset
    raw = {run: np.array([[float(per_seed[s]["runs"][run]["metrics"][m]) for m in names] for s in seeds])
           for run in runs}
    mean = np.mean(np.stack(list(raw.values())), axis=(0, 1)) if names else np.array([])
    return tasks, {run: matrix / np.where(mean == 0, 1.0, mean) for run, matrix in raw.items()}


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """rliable's ``metrics.probability_of_improvement`` (P(X_m > Y_m), ties counted half, averaged over
    the tasks m: the Mann-Whitney U statistic over n_x n_y) by broadcasting: scipy's test per task
    and bootstrap replicate took ~1 ms, 50 s for one paper's intervals. Equal to rliable's
    (tests/test_claims.py)."""
    x, y = scores_x[:, None, :], scores_y[None, :, :]
    per_task = ((x > y).sum(axis=(0, 1)) + 0.5 * (x == y).sum(axis=(0, 1))) / (scores_x.shape[0] * scores_y.shape[0])
    return float(np.mean(per_task))


def interval_estimates(seed: int, *calls: tuple[dict[str, Any], Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """rliable's ``get_interval_estimates`` (REPS stratified-bootstrap replications) for each
    (scores, func) in turn, from one generator seeded by ``seed``: reproducible. rliable 1.2's
    StratifiedBootstrap draws its indices from NumPy's global generator, not from the random_state
    it passes to arch, so that is seeded too (and given back as it was)."""
    from rliable import library as rly

    saved = np.random.get_state()
    np.random.seed(seed)
    state = np.random.RandomState(seed)
    try:
        with warnings.catch_warnings():  # arch 7 warns that random_state, which rliable passes, is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            return [rly.get_interval_estimates(scores, func, reps=REPS, random_state=state) for scores, func in calls]
    finally:
        np.random.set_state(saved)


def paper_aggregate(config: dict[str, Any], per_seed: dict[Any, dict[str, Any]], seed: int) -> dict[str, Any]:
    """The paper's rliable aggregate: ``iqm`` (run -> [point, lo, hi]) and ``improvement`` (one per
    claim on runs: a, b, [P(a > b), lo, hi]), or ``skipped`` with the reason."""
    from rliable import metrics

    runs = compared_runs(config)
    if len(runs) < 2:
        return {"skipped": "its claims compare table cells at operating points, not runs"}
    if any(run not in values.get("runs", {}) for values in per_seed.values() for run in runs):
        return {"skipped": "a compared run has no scores in some seed"}
    tasks, scores = score_matrices(per_seed, runs)
    if not tasks:
        return {"skipped": "the compared runs share no metric"}
    pairs = {f"{c['a']},{c['b']}": (scores[c["a"]], scores[c["b"]])
             for c in config["claims"] if isinstance(c["a"], str) and isinstance(c["b"], str)}
    (point, interval), (p_point, p_interval) = interval_estimates(
        seed, (scores, lambda x: np.array([metrics.aggregate_iqm(x)])), (pairs, probability_of_improvement))
    return {"tasks": tasks, "seeds": len(per_seed), "reps": REPS,
            "iqm": {run: [float(point[run][0]), float(interval[run][0][0]), float(interval[run][1][0])]
                    for run in runs},
            "improvement": [{"a": key.split(",")[0], "b": key.split(",")[1],
                             "p": [float(p_point[key]), float(p_interval[key][0][0]), float(p_interval[key][1][0])]}
                            for key in pairs]}


def aggregate_markdown(aggregate: dict[str, Any]) -> str:
    """The aggregate as the paper page's section."""
    head = ["", "## Aggregate over seeds and metrics (rliable)", ""]
    if "skipped" in aggregate:
        return "\n".join(head + [f"No run-level aggregate: {aggregate['skipped']}.", ""])
    lines = head + [f"Interquartile mean of each run's normalised scores (each task's score over its mean across "
                    f"the compared runs and seeds; tasks: {', '.join(aggregate['tasks'])}) over {aggregate['seeds']} "
                    f"seeds, and the probability that a claim's run a improves on its run b; stratified-bootstrap "
                    f"95% intervals ({aggregate['reps']:,} replications; Agarwal et al. 2021).", "",
                    "| run | IQM | 95% CI |", "|---|---|---|"]
    lines += [f"| {run} | {p:.3f} | [{lo:.3f}, {hi:.3f}] |" for run, (p, lo, hi) in aggregate["iqm"].items()]
    lines += ["", "| a | b | P(a > b) | 95% CI |", "|---|---|---|---|"]
    lines += [f"| {x['a']} | {x['b']} | {x['p'][0]:.2f} | [{x['p'][1]:.2f}, {x['p'][2]:.2f}] |"
              for x in aggregate["improvement"]]
    return "\n".join(lines + [""])


def aggregate_png(aggregate: dict[str, Any], title: str, path: Any) -> None:
    """The aggregate as a figure (atomically): each run's IQM and each claim's P(a > b), with their
    intervals (P against 0.5: no difference); a paper without one, a figure saying why."""
    rows = [] if "skipped" in aggregate else list(aggregate["iqm"].items())
    pairs = [] if "skipped" in aggregate else aggregate["improvement"]
    height = 1.4 + 0.35 * max(len(rows) + len(pairs), 1)
    fig = Figure(figsize=(10.0, height))
    FigureCanvasAgg(fig)
    if "skipped" in aggregate:
        fig.text(0.02, 0.5, f"{title}: no run-level aggregate ({aggregate['skipped']})", va="center")
    else:
        grid = fig.add_gridspec(1, 2, left=0.2, right=0.98, wspace=0.9, top=1 - 0.5 / height, bottom=0.6 / height)
        left, right = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
        for ax, items, labels, ref, xlabel in (
                (left, [v for _, v in rows], [r.split("/", 1)[1] for r, _ in rows], 1.0, "IQM of normalised scores"),
                (right, [x["p"] for x in pairs], [f"{x['a'].split('/', 1)[1]} > {x['b'].split('/', 1)[1]}" for x in pairs],
                 0.5, "P(a > b)")):
            ys = range(len(items))[::-1]
            for y, (point, lo, hi) in zip(ys, items):
                ax.plot([lo, hi], [y, y], color="#2c7fb8", linewidth=3)
                ax.plot([point], [y], "o", color="#08306b")
            ax.axvline(ref, color="#999999", linestyle="--", linewidth=1)
            ax.set_yticks(list(ys), labels, fontsize=8)
            ax.set_xlabel(xlabel)
            ax.set_ylim(-0.7, len(items) - 0.3)
        fig.suptitle(f"{title}: rliable aggregate over {aggregate['seeds']} seeds, 95% stratified-bootstrap intervals",
                     fontsize=9)
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})


def method_label(scores: dict[str, Any]) -> str:
    """A run's method as the tables name it: its objective, SCST's NSC baseline as ``nsc``."""
    baseline = scores.get("options", {}).get("baseline")
    return "nsc" if scores.get("method") == "scst" and baseline == "nsc" else str(scores.get("method"))


def across_papers(papers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every method the papers' claims trained (every evaluated run of every seed), over every paper,
    model and metric it ran on: the IQM of its score over its own XE start's (same seed, same metric; a run without its start among the scores
    is left out) with its stratified-bootstrap interval. ``papers``: paper -> its stored json."""
    from rliable import metrics

    columns: dict[str, list[np.ndarray]] = {}
    where: dict[str, set[str]] = {}
    for paper, data in sorted(papers.items()):
        per_seed = data.get("per_seed") or {}  # a result stored with its values only: nothing to aggregate
        if not per_seed or any("runs" not in values for values in per_seed.values()):
            continue
        seeds = sorted(per_seed, key=int)
        runs = sorted(set.intersection(*(set(per_seed[s]["runs"]) for s in seeds)))
        for run in runs:
            first = per_seed[seeds[0]]["runs"][run]
            start = f"{run.split('/', 1)[0]}/{first.get('init', {}).get('model')}"
            if first.get("method") == "xe" or not all(start in per_seed[s]["runs"] for s in seeds):
                continue
            names = sorted(k for k, v in first["metrics"].items() if isinstance(v, (int, float)) and
                           all(isinstance(per_seed[s]["runs"][start]["metrics"].get(k), (int, float)) and
                               per_seed[s]["runs"][start]["metrics"][k] > 0 for s in seeds))
            ratio = np.array([[per_seed[s]["runs"][run]["metrics"][m] / per_seed[s]["runs"][start]["metrics"][m]
                               for m in names] for s in seeds])
            label = method_label(first)
            columns.setdefault(label, []).append(ratio)
            where.setdefault(label, set()).add(f"{paper} {first.get('model')}")
    n_seeds = {label: {c.shape[0] for c in cols} for label, cols in columns.items()}
    scores = {label: np.concatenate(cols, axis=1) for label, cols in columns.items() if len(n_seeds[label]) == 1}
    if not scores:
        return {"skipped": "no compared run has its XE start's scores"}
    ((point, interval),) = interval_estimates(0, (scores, lambda x: np.array([metrics.aggregate_iqm(x)])))
    return {"reps": REPS, "methods": {label: {"iqm": [float(point[label][0]), float(interval[label][0][0]),
                                                      float(interval[label][1][0])],
                                              "tasks": int(scores[label].shape[1]), "seeds": int(scores[label].shape[0]),
                                              "where": sorted(where[label])} for label in sorted(scores)}}


def across_markdown(result: dict[str, Any]) -> str:
    lines = ["", "Aggregate over the papers (rliable): each method the claims trained, its score over its own XE "
             "start's (same seed, same metric; the run it starts from: XE, but for paper 004's frozen speakers), "
             "interquartile mean over every seed and every task (a paper's model and metric) it ran, with its "
             "stratified-bootstrap 95% interval (1: no gain over its start).", ""]
    if "skipped" in result:
        return "\n".join(lines + [f"None: {result['skipped']}.", ""])
    lines += ["| method | IQM of score / XE start's | 95% CI | seeds x tasks | papers and models |", "|---|---|---|---|---|"]
    for label, m in sorted(result["methods"].items(), key=lambda kv: -kv[1]["iqm"][0]):
        p, lo, hi = m["iqm"]
        lines.append(f"| {label} | {p:.3f} | [{lo:.3f}, {hi:.3f}] | {m['seeds']} x {m['tasks']} | {', '.join(m['where'])} |")
    return "\n".join(lines + [""])
