"""What the workflow builds, from params.yaml: one plan for the Snakefile and for dvc.yaml.

``workflow/rules/common.smk`` builds a :class:`Plan` from Snakemake's ``config``; ``caprl
dvc-yaml`` (:mod:`caprl.workflow.dvc`) builds the same plan and writes one DVC stage per job.
The plan holds every path pattern of the DAG (all carry the dataset name), the enabled
datasets, the training jobs ``(dataset, run)`` with their ``--init ROLE=PATH`` checkpoints,
the runs that are evaluated (their objective yields a caption model), the runs whose listener
is scored on the gold captions (their objective pre-trains one alone), the file CLIP-S's
embedding reads in an evaluation or a clip_s reward (:meth:`Plan.evaluate_embedding`,
:meth:`Plan.train_embedding`: a listener run's checkpoint, or the raw images), the attention-figure
run of each dataset, the table files, and the runs it leaves out because their reward
cannot run on this machine (:attr:`Plan.skipped`, with the reason; the tables show them).
Pure Python, no file is read: ``build_plan(params)`` on a validated params dict. The datasets'
files are :class:`caprl.workflow.datasets.Dataset`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from caprl.io.layout import (  # noqa: F401  (re-exported: the Snakefile, DVC and stages read wp.<NAME>)
    RAW_LOGS, ANNOTATIONS, VOCAB, LABELS, CIDER_DF, REFS, SHARD_DIR, SHARD, FEATURES, CHECKPOINT, HISTORY,
    STATE_DIR, RESULTS, CAPTIONS, SCORES, EXAMPLES, RETRIEVAL, FIGURES_DIR, PSST_FIGURES, PSST_PNG,
    ATTENTION_DIR, ATTENTION_PNG, CURVES_DIR, CURVES_PNG, CURVES_CSV, CURVES_OVERVIEW, TABLES_DIR, TABLE,
    TABLE_FORMATS, TUNING,
)
from caprl import params as params_mod, run_points
from caprl.errors import CaprlError
from caprl.params import BOTTOMUP, RunSpec
from caprl.workflow.datasets import (  # noqa: F401  (GENERATED...: re-exported, the Snakefile reads wp.<NAME>)
    GENERATED, GENERATED_MEDIA, GENERATED_RAW, RAW_SIDE_FILES, Dataset, check_generated,
)

log = logging.getLogger(__name__)

BASELINE_RUN = "most-frequent"
CPU_BACKBONES = ("patches", "tinycnn")  # the built-in cheap backbones: their feature jobs ask for no GPU
# Stack-Cap Fig. 3 is drawn from the first (enabled, not skipped) run of this method and arch.
ATTENTION_METHOD, ATTENTION_ARCH = "c2f", "stackcap"


@dataclass(frozen=True)
class TrainJob:
    """One training run on one dataset."""

    dataset: str
    spec: RunSpec
    captioner: bool
    retrieval: bool = False  # a captioner whose run holds a listener: ranked by the retrieval stage
    gold_retrieval: bool = False  # a listener pre-training run: its listener ranked by the gold captions
    tuning: bool = False  # a point of tuning: (trained for its validation score only: never evaluated)

    @property
    def run(self) -> str:
        return self.spec.name

    @property
    def checkpoint(self) -> str:
        return CHECKPOINT.format(dataset=self.dataset, run=self.run)

    @property
    def history(self) -> str:
        return HISTORY.format(dataset=self.dataset, run=self.run)

    @property
    def state_dir(self) -> str:
        return STATE_DIR.format(dataset=self.dataset, run=self.run)

    @property
    def init(self) -> dict[str, str]:
        """Role -> checkpoint it starts from (``runs/<dataset>/<run>/best.pt``)."""
        return {role: CHECKPOINT.format(dataset=self.dataset, run=source) for role, source in self.spec.init.items()}

    @property
    def start(self) -> str | None:
        """``init.model``'s checkpoint (None from scratch): evaluation's KL reference (caprl.evaluation.start_kl)."""
        return self.init.get("model")

    def init_args(self) -> str:
        """``--init ROLE=PATH ...`` as the train command takes them ("" for none)."""
        return " ".join(f"--init {role}={path}" for role, path in self.init.items())

    def result(self, pattern: str) -> str:
        """One of CAPTIONS, SCORES, EXAMPLES for this run."""
        return pattern.format(dataset=self.dataset, run=self.run)

    def settings_keys(self, params: dict[str, Any]) -> list[str]:
        """The params.yaml keys (dotted paths) whose values the training job reads: a change of any
        re-runs it, under Snakemake (:meth:`settings`, its params trigger) and DVC (the stage's
        ``params:``) alike. The dataset's settings reach it only through its input files (features,
        labels, references), which both engines track; ``loading`` and ``tracking`` change no number."""
        spec = self.spec
        keys = ["seed", "train", "decode", f"models.{spec.model}", "objective_defaults", f"objectives.{spec.method}",
                f"runs.{spec.source}"]
        if spec.source != self.run:
            keys.append("sweeps")  # the run is a point of its source's sweep
        reward = spec.options.get("reward")
        if reward:
            keys += [f"rewards.{name}" for name in dict.fromkeys([reward, *reward_components(params, reward)])]
        if self.retrieval or self.gold_retrieval or (reward and _listener_run(params, reward)):  # sizes: listener:
            keys.append("listener")
        return keys

    def settings(self, params: dict[str, Any]) -> dict[str, Any]:
        """``{key: value}`` of :meth:`settings_keys` (None for a key params does not hold)."""
        return {key: lookup(params, key) for key in self.settings_keys(params)}


def lookup(params: dict[str, Any], key: str, missing: Any = None) -> Any:
    """The value at a dotted path of params (``missing`` where a part is missing)."""
    value: Any = params
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return missing
        value = value[part]
    return value


def embedding_args(files: dict[str, str]) -> str:
    """``--embedding-listener PATH`` / ``--media-root DIR`` as a stage command takes them ("" for none)."""
    return " ".join(f"{flag} {path}" for flag, path in files.items())


def reward_components(params: dict[str, Any], reward: str) -> list[str]:
    """The rewards a configured mix weighs (``rewards.<reward>.weights``); [] for a plain reward."""
    entry = params.get("rewards", {}).get(reward)
    weights = entry.get("weights") if isinstance(entry, dict) else None
    return [name for name in weights if name in params.get("rewards", {})] if isinstance(weights, dict) else []


@dataclass
class Plan:
    params: dict[str, Any]
    datasets: dict[str, Dataset]
    jobs: dict[tuple[str, str], TrainJob]                       # (dataset, run) -> job
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)  # (dataset, run) -> reason

    def job(self, dataset: str, run: str) -> TrainJob:
        if (dataset, run) not in self.jobs:
            why = self.skipped.get((dataset, run), "not a run of this dataset")
            raise CaprlError(f"runs.{run}: no training job on dataset {dataset} ({why})")
        return self.jobs[(dataset, run)]

    def waiting_on(self, dataset: str, run: str) -> int:
        """How many training jobs start from ``run``'s checkpoint, directly or through others: the
        whole part of the train rule's scheduling priority (:mod:`caprl.workflow.priority`)."""
        below: set[str] = set()
        frontier = [run]
        while frontier:
            source = frontier.pop()
            for (ds, other), job in self.jobs.items():
                if ds == dataset and other not in below and source in job.spec.init.values():
                    below.add(other)
                    frontier.append(other)
        return len(below)

    def trained(self, dataset: str) -> list[TrainJob]:
        """The dataset's training jobs that ``all_tables`` builds (every job but the tuning points)."""
        return [job for (ds, _), job in self.jobs.items() if ds == dataset and not job.tuning]

    def tuning_points(self, dataset: str) -> dict[str, list[TrainJob]]:
        """Tuned run -> its tuning points' jobs on ``dataset`` (``tuning.runs``; ``snakemake tuning``)."""
        out: dict[str, list[TrainJob]] = {}
        for (ds, _), job in self.jobs.items():
            if ds == dataset and job.tuning:
                out.setdefault(self.params["runs"][job.run][run_points.TUNED_FROM], []).append(job)
        return out

    def tuning_files(self) -> list[str]:
        """The tuning reports (one per dataset with tuning points): the ``tuning`` target."""
        return [TUNING.format(dataset=ds, ext=ext) for ds in self.datasets if self.tuning_points(ds)
                for ext in ("md", "json")]

    def retrieved(self, dataset: str) -> list[TrainJob]:
        """The evaluated jobs whose checkpoint holds a listener (paper 004's methods)."""
        return [job for job in self.evaluated(dataset) if job.retrieval]

    def retrieval_files(self, dataset: str) -> list[str]:
        return [job.result(RETRIEVAL) for job in self.retrieved(dataset)]

    def gold_retrieved(self, dataset: str) -> list[TrainJob]:
        """The trained jobs whose objective pre-trains a listener alone (``gold_retrieval``): their
        listener ranks the evaluation split's images by their first gold caption (``caprl retrieval
        --gold``), into the same ``retrieval.json`` path (they have no captions of their own)."""
        return [job for job in self.trained(dataset) if job.gold_retrieval]

    def gold_retrieval_files(self, dataset: str) -> list[str]:
        return [job.result(RETRIEVAL) for job in self.gold_retrieved(dataset)]

    def table_inputs(self, dataset: str) -> list[str]:
        """What every table job of ``dataset`` reads: the score files, the retrieval results of the
        runs with a listener, and the listener runs' gold-caption retrieval results."""
        return self.scores(dataset) + self.retrieval_files(dataset) + self.gold_retrieval_files(dataset)

    def psst_pngs(self, dataset: str) -> list[str]:
        """Paper 004's Figs. 3-4 of ``dataset``: drawn where it has runs with a listener."""
        if not self.retrieved(dataset):
            return []
        return [PSST_PNG.format(dataset=dataset, figure=figure) for figure in PSST_FIGURES]

    def evaluated(self, dataset: str) -> list[TrainJob]:
        """The jobs whose objective yields a caption model: evaluated, shown in the tables."""
        return [job for job in self.trained(dataset) if job.captioner]

    def skipped_runs(self, dataset: str) -> dict[str, str]:
        """Run -> why it is not run on ``dataset`` on this machine."""
        return {run: reason for (ds, run), reason in self.skipped.items() if ds == dataset}

    def attention_job(self, dataset: str) -> TrainJob | None:
        """The run Stack-Cap Fig. 3 is drawn from; None where there is none, or where the regions are
        bottom-up boxes (the figure draws attention over a grid of regions)."""
        ds = self.datasets.get(dataset)
        if ds is not None and ds.bottomup:
            return None
        models = self.params["models"]
        return next((job for job in self.trained(dataset) if job.spec.method == ATTENTION_METHOD
                     and models[job.spec.model]["arch"] == ATTENTION_ARCH), None)

    def attention_pngs(self, dataset: str) -> list[str]:
        if self.attention_job(dataset) is None:
            return []
        return [ATTENTION_PNG.format(dataset=dataset, k=k) for k in range(self.params["figures"]["attention_images"])]

    def curve_files(self, dataset: str) -> list[str]:
        """What ``caprl curves`` writes for ``dataset``: per trained run its PNG and CSV, then the
        overview (none where the dataset trains no run)."""
        runs = [job.run for job in self.trained(dataset)]
        if not runs:
            return []
        return [pattern.format(dataset=dataset, run=run) for run in runs for pattern in (CURVES_PNG, CURVES_CSV)] \
            + [CURVES_OVERVIEW.format(dataset=dataset)]

    def scores(self, dataset: str) -> list[str]:
        """Every score file the tables of ``dataset`` read (evaluated runs, then the baseline)."""
        runs = [job.run for job in self.evaluated(dataset)] + [BASELINE_RUN]
        return [SCORES.format(dataset=dataset, run=run) for run in runs]

    def tables(self, dataset: str) -> list[str]:
        """The names of the tables built for ``dataset`` (its own list or ``tables:``)."""
        return params_mod.dataset_tables(self.params, dataset)

    def table_files(self, dataset: str | None = None) -> list[str]:
        names = [dataset] if dataset else list(self.datasets)
        return [TABLE.format(dataset=ds, table=table, ext=ext)
                for ds in names for table in self.tables(ds) for ext in TABLE_FORMATS]

    def missing_raw(self) -> list[str]:
        return [why for ds in self.datasets.values() if (why := ds.missing_raw())]

    def evaluate_embedding(self, dataset: str) -> dict[str, str]:
        """``{flag: path}``: what CLIP-S's embedding reads in the evaluations of ``dataset``
        (``evaluate.clip_score``, :mod:`caprl.evaluation.clip_score`); {} for embedding none, or where
        its listener run does not train on the dataset (the score file then says CLIP-S is unavailable)."""
        from caprl.metrics.embeddings import clip_score_settings

        settings = clip_score_settings(self.params, dataset)
        return self._embedding_files(dataset, settings.spec if settings else None)

    def evaluate_settings_keys(self, dataset: str) -> list[str]:
        """The params keys an evaluation of ``dataset`` reads besides its run's (DVC's stage params)."""
        return ["evaluate", "decode"] + ([f"datasets.{dataset}.clip_score"]
                                         if "clip_score" in self.params["datasets"][dataset] else [])

    def train_embedding(self, job: TrainJob) -> dict[str, str]:
        """``{flag: path}``: what the embedding of the job's clip_s reward reads ({} for none)."""
        from caprl.rewards.config import embedding_spec

        reward = job.spec.options.get("reward")
        return self._embedding_files(job.dataset, embedding_spec(reward, self.params) if reward else None)

    def _embedding_files(self, dataset: str, spec: Any) -> dict[str, str]:
        from caprl.metrics.embeddings import stage_files

        return stage_files(spec, self.datasets[dataset].media_root,
                           lambda run: CHECKPOINT.format(dataset=dataset, run=run), lambda run: (dataset, run) in self.jobs)


def build_plan(params: dict[str, Any]) -> Plan:
    """The plan of a validated params dict; CaprlError naming the key for a bad reference."""
    from caprl.data.readers import build_reader, check_datasets
    from caprl.features.backbones import BACKBONES
    from caprl.objectives import run_checks
    from caprl.tables import published

    params = params_mod.resolve(params)
    params_mod.check(params)
    check_datasets(params)
    datasets = {}
    for name in params_mod.enabled_datasets(params):
        spec = params_mod.dataset_spec(params, name)
        build_reader(spec["format"], name)  # a format whose reader has not landed is an error now
        if spec["backbone"] != BOTTOMUP:  # (bottomup: converted from TSVs, checked with its files)
            run_checks.refuse(run_checks.name_problem(BACKBONES, spec["backbone"], f"datasets.{name}.backbone"))
        check_generated(spec)
        published.check_dataset(params, name)  # datasets.<name>.published: registered sets of this dataset
        datasets[name] = Dataset(name, spec["format"], spec["raw"], spec["media_root"], spec["generate"],
                                 spec["backbone"], tuple(spec.get("bottomup_tsv", ())))
    specs = {run: params_mod.run_spec(params, run) for run in params["runs"]}
    reasons: dict[str, str | None] = {}
    plan = Plan(params, datasets, {})
    for run, spec in specs.items():
        reason = _skip_reason(params, specs, run, reasons)
        for dataset in spec.datasets:
            if reason is None:
                captioner, retrieval, gold = _roles(run, spec.method)
                tuning = run_points.TUNED_FROM in params["runs"][run]
                plan.jobs[(dataset, run)] = TrainJob(dataset, spec, captioner, retrieval, gold, tuning)
            else:
                plan.skipped[(dataset, run)] = reason
    _check_runs(plan)
    return plan


def _check_runs(plan: Plan) -> None:
    """What each run asks of its method (:mod:`caprl.objectives.run_checks`, the checks the stages make too):
    init roles its method has, ``init.model`` from a run that trains a caption model, and an
    evaluation decoder that is registered and whose module the method trains, options that are the method's;
    and what it asks of its caption model (:mod:`caprl.workflow.model_checks`)."""
    from caprl.decoding import DECODERS
    from caprl.decoding import lookahead  # noqa: F401  (registers the lookahead decoder)
    from caprl.decoding import options as decode_options
    from caprl.objectives import run_checks
    from caprl.workflow import model_checks

    for (ds, _), job in plan.jobs.items():
        spec = job.spec
        run_checks.refuse(run_checks.options_problem(job.run, spec.method, spec.options))
        for role in spec.init:
            run_checks.refuse(run_checks.init_role_problem(spec.source, spec.method, role))
        origin = plan.jobs.get((ds, spec.init.get("model", "")))
        if origin is not None:
            run_checks.refuse(run_checks.init_model_problem(spec.source, origin.spec.source, origin.spec.method,
                                                            origin.spec.init))
        model_checks.check_job(plan.params, job, plan.jobs)
        _check_reward_embedding(plan, job)
        if job.captioner:
            key = run_checks.decode_key(plan.params, job.run)
            run_checks.refuse(run_checks.name_problem(DECODERS, spec.decode["method"], key))
            run_checks.refuse(decode_options.run_options_problem(plan.params, job.run, spec.decode, name_run=False))
            run_checks.refuse(run_checks.decoder_problem(job.run, spec.method, spec.decode["method"], key))


def _listener_run(params: dict[str, Any], reward: str) -> str | None:
    """The run whose listener the reward's clip_s embeds with (None: no clip_s, or embedding clip)."""
    from caprl.rewards.config import embedding_spec

    spec = embedding_spec(reward, params)
    return spec.listener if spec is not None and spec.embedding == "listener" else None


def _check_reward_embedding(plan: Plan, job: TrainJob) -> None:
    """A clip_s reward whose embedding is a run's listener needs that run trained on the job's dataset."""
    reward = job.spec.options.get("reward")
    source = _listener_run(plan.params, reward) if reward else None
    if source is not None and (job.dataset, source) not in plan.jobs:
        raise CaprlError(f"rewards.{reward}.listener: run {job.run} is rewarded by CLIP-S in the listener of run "
                         f"'{source}', which does not train on dataset {job.dataset} (add it there, or name another)")


def skipped_runs(params: dict[str, Any], dataset: str) -> dict[str, str]:
    """Run -> why the workflow does not run it on ``dataset`` here (for the tables)."""
    return build_plan(params).skipped_runs(dataset)


def log_skipped(plan: Plan) -> None:
    for (dataset, run), reason in plan.skipped.items():
        log.warning("run %s on dataset %s is skipped: %s", run, dataset, reason)


def _skip_reason(params: dict[str, Any], specs: dict[str, RunSpec], run: str,
                 memo: dict[str, str | None]) -> str | None:
    """Why ``run`` cannot run on this machine: its reward is unavailable, or a run it starts from is skipped."""
    if run in memo:
        return memo[run]
    from caprl.rewards import reward_unavailable_reason

    spec = specs[run]
    reward = spec.options.get("reward")
    reason = reward_unavailable_reason(reward, params) if reward is not None else None
    for source in spec.init.values():
        if reason is None and _skip_reason(params, specs, source, memo) is not None:
            reason = f"starts from run {source}, which is skipped"
    memo[run] = reason
    return reason


def _roles(run: str, method: str) -> tuple[bool, bool, bool]:
    """(the method yields a caption model, its runs hold a listener for the retrieval stage, its runs
    pre-train a listener scored on the gold captions), from the objective's class attributes."""
    from caprl.objectives import OBJECTIVES

    cls = OBJECTIVES.get(method, where=f"runs.{run}.method")
    captioner, retrieval, gold = bool(cls.captioner), bool(cls.captioner and cls.retrieval), bool(cls.gold_retrieval)
    if retrieval and gold:
        raise CaprlError(f"runs.{run}.method: objective {method} is a captioner with a listener (retrieval) and "
                         "sets gold_retrieval too; a run has one retrieval.json: set one of them")
    return captioner, retrieval, gold
