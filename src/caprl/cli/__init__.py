"""``caprl <stage> ...``: one subcommand per pipeline stage.

Each stage is a module with ``add_arguments(parser)`` and ``main(args)``; modules are
imported only when their stage runs, so ``caprl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

from caprl.errors import CaprlError, WriteError

# stage name -> (module, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "synthesize": ("caprl.data.synthesize", "generate a dataset's raw files with the built-in generator (images or GIFs)"),
    "prepare": ("caprl.data.prepare", "Karpathy-format JSON -> normalised annotations"),
    "vocab": ("caprl.data.vocab", "vocabulary + HDF5 labels from the normalised annotations"),
    "features": ("caprl.features.extract", "extract one shard of image features with a registered backbone"),
    "merge-features": ("caprl.features.merge", "merge feature shards into one HDF5 file"),
    "references": ("caprl.data.references", "COCO-format reference captions of one split (for evaluation)"),
    "cider-df": ("caprl.rewards.document_frequencies", "CIDEr-D document frequencies of the training references"),
    "train": ("caprl.training.run", "train one run (model + objective) from params.yaml"),
    "baseline": ("caprl.evaluation.baseline", "trivial baseline: the most frequent training caption for every image"),
    "evaluate": ("caprl.evaluation.run", "beam-search captions on a split and score them with the official metrics"),
    "caption": ("caprl.evaluation.caption", "a trained run's captions of any images (a folder or files): JSON + HTML page"),
    "caption-page": ("caprl.evaluation.caption_page", "several runs' captions of the same images side by side (HTML)"),
    "retrieval": ("caprl.evaluation.retrieval",
                  "paper 004: rank every image of the split by a run's captions with its own listener (recall@K)"),
    "score": ("caprl.metrics.score_cli", "score a COCO results file against COCO references"),
    "tables": ("caprl.tables.build", "build the result tables (Markdown, CSV, LaTeX)"),
    "tune-report": ("caprl.workflow.tuning", "choose each tuned run's options by its tuning points' validation scores"),
    "attention-figure": ("caprl.figures.attention", "Stack-Cap Fig. 3: every stage's caption with its attention maps (PNG)"),
    "psst-figures": ("caprl.figures.discriminative",
                     "paper 004 Figs. 3-4: recall@10 against each language metric, and against rho (PNG)"),
    "curves": ("caprl.figures.curves", "learning curves of every run of a dataset: PNG + CSV per run, an overview PNG"),
    "claims": ("caprl.claims.pages", "a paper's claims: verdicts over every seed of its configuration (claims_<paper>)"),
    "claims-summary": ("caprl.claims.summary", "every paper's claims in one page (results/claims/summary.md)"),
    "claims-plan": ("caprl.claims.plan", "the claims' jobs and GPU-hours per paper over its seeds (all_claims)"),
    "dvc-yaml": ("caprl.workflow.dvc", "write dvc.yaml from params.yaml (the jobs the Snakefile runs)"),
    "plan": ("caprl.workflow.plan_report", "every job of the plan with its estimated GPU-hours and peak memory, and the total"),
    "download": ("caprl.data.download", "download a real dataset's files (COCO 2014, Karpathy's splits, TGIF GIFs)"),
    "setup-spice": ("caprl.metrics.spice_setup", "install SPICE's CoreNLP 3.6.0 jars from Maven Central or a mirror"),
    "bottomup": ("caprl.data.bottomup", "bottom-up-attention 36-box feature TSV(s) -> a features HDF5 file"),
    "pretrain-tinycnn": ("caprl.features.tinycnn",
                         "remake the synthetic sets' backbone weights: a tiny CNN trained on single rendered shapes"),
    "dvc-lock": ("caprl.workflow.dvc_sync", "after a Snakemake run: record its outputs in dvc.lock and DVC's cache (dvc commit)"),
    "mlflow-sync": ("caprl.workflow.mlflow_sync", "log to MLflow, from the jobs' files, what their jobs could not (server down)"),
    "with-services": ("caprl.cli.services", "run a command (e.g. dvc repro) with the job server and METEOR server "
                                        "that a local Snakemake run starts for its jobs"),
}
# Stages that maintain the repository, not steps of the DAG.
TOOLS = {"score", "plan", "claims-plan", "dvc-yaml", "dvc-lock", "mlflow-sync", "download", "setup-spice", "bottomup",
         "pretrain-tinycnn", "with-services"}
TOOLS |= {"caption", "caption-page"}  # on demand (`snakemake caption_folder`), not steps of all_tables' DAG


def setup_logging(log_file: str | None, verbose: bool = False) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="a", encoding="utf-8"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="caprl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    for name, (_module, help_text) in STAGES.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("--params", nargs="+", default=["params.yaml"], metavar="FILE",
                        help="parameters file(s), later ones laid over earlier ones, e.g. "
                             "params.yaml configs/recipes/<name>.yaml (default: params.yaml)")
        sp.add_argument("--log", default=None, help="also append log lines to this file")
        sp.add_argument("-v", "--verbose", action="store_true")
    return parser


def entry() -> int:
    """The ``caprl`` command (and ``python -m caprl``): a DAG stage goes to the job server named by
    ``$CAPRL_JOB_SERVER`` when one answers there (a local Snakemake run's pre-loaded process), else
    runs here. Only the command forwards; :func:`main` always runs in the calling process."""
    argv = sys.argv[1:]
    stage = next((a for a in argv if not a.startswith("-")), None)
    if stage in STAGES and stage not in TOOLS and os.environ.get("CAPRL_JOB_SERVER"):
        from caprl.runtime.job_client import run_in_server

        code = run_in_server(argv)
        if code is not None:
            return code
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    """Run ``caprl *argv`` in this process; its exit code (2: a user error, printed without a traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stage = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser()
    # Parse the stage name first, then let the stage add its own arguments.
    if stage in STAGES:
        module = importlib.import_module(STAGES[stage][0])
        stage_parser = parser._subparsers._group_actions[0].choices[stage]  # type: ignore[union-attr]
        module.add_arguments(stage_parser)
    args = parser.parse_args(argv)
    setup_logging(args.log, args.verbose)
    try:
        module = importlib.import_module(STAGES[args.stage][0])
        module.main(args)
    except CaprlError as exc:
        return user_error(args.stage, exc)
    except Exception as exc:
        # a full disk, quota or file-size limit met outside caprl.io's atomic writes
        from caprl.io import write_error

        error = write_error(exc)
        if error is None:
            raise
        return user_error(args.stage, error)
    return 0


def user_error(stage: str, exc: CaprlError) -> int:
    """Log and print ``caprl <stage>: error: <message>`` (no traceback); the exit code, 2."""
    logging.getLogger("caprl").error("%s", exc)
    print(f"caprl {stage}: error: {exc}", file=sys.stderr)
    if isinstance(exc, WriteError):
        from caprl.io import hdf5_files_left_open

        if hdf5_files_left_open():  # a failed HDF5 close: the library's teardown would crash (SIGSEGV)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
    return 2
