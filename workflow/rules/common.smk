# The plan of the workflow (caprl.workflow.plan, shared with `caprl dvc-yaml`): enabled
# datasets, training jobs (dataset, run), evaluated runs, skipped runs, every path pattern.
# params.yaml (and a recipe laid over it) is the only source of parameters: every stage reads
# it (PARAMS) and checks it.
import os
import re
from pathlib import Path

from caprl import params as params_mod, run_points
from caprl.workflow import plan as wp
from caprl.workflow.priority import train_priorities
from caprl.errors import CaprlError

# A recipe (`--configfile configs/recipes/<name>.yaml`) is laid over params.yaml by Snakemake
# (config) and by every stage, which reads the same files in the same order (caprl.params.merge).
PARAMS = " ".join(["params.yaml", *(os.path.relpath(f) for f in workflow.overwrite_configfiles)])
# In a claims seed's module every input, output and log path is under the seed's folder (the
# module's prefix); paths a stage gets as params or in its params file take it here.
WORKSPACE = CLAIMS_SEED["workspace"] + "/" if CLAIMS_SEED else ""
if CLAIMS_SEED:
    PARAMS = CLAIMS_SEED["params_file"]


def here(path):
    """``path`` in this workflow's folder: the seed's under a claims module, else as it is."""
    return WORKSPACE + path
try:
    PLAN = wp.build_plan(config)
except CaprlError as exc:
    raise WorkflowError(f"{PARAMS}: {exc}")
for reason in PLAN.missing_raw():
    raise WorkflowError(reason)

for (ds, run), reason in PLAN.skipped.items():
    logger.warning(f"run {run} on dataset {ds} is skipped: {reason}")

DATASETS = PLAN.datasets
# In a claims seed's module a real dataset's data (annotations .. features) are the project's: they do
# not depend on the seed, so they are made once for every seed and hard-linked into the seed's folder
# (rule shared_data); a generated dataset is drawn from the seed, its data made in the seed's folder.
OWN_DATA = [ds for ds, spec in DATASETS.items() if spec.generate or not CLAIMS_SEED]
SHARED_DATA = [ds for ds in DATASETS if ds not in OWN_DATA]
GENERATED_IMAGES = [ds for ds, spec in DATASETS.items() if spec.generate and spec.format == "karpathy"]
GENERATED_VIDEOS = [ds for ds, spec in DATASETS.items() if spec.generate and spec.format == "tgif"]
EVAL_SPLIT = config["evaluate"]["split"]
TABLE_FILES = PLAN.table_files()
TABLE_NAMES = sorted({table for ds in DATASETS for table in PLAN.tables(ds)})
FIGURE_FILES = [path for ds in DATASETS for path in PLAN.attention_pngs(ds) + PLAN.psst_pngs(ds) + PLAN.curve_files(ds)]
RUNS = {run: PLAN.params["runs"][run] for run in run_points.compared_runs(PLAN.params)}  # sweeps expanded
TUNING_FILES = PLAN.tuning_files()
# GPUs per job where params.yaml decides (the SLURM profile gives the others): a training
# job runs train.gpus DDP processes; features runs a CNN backbone on a GPU, patches and tinycnn on CPU.
TRAIN_GPUS = config["train"]["gpus"]


def job_resources(rule, gpu=None):
    """What one job of `rule` asks a cluster for: params' resources.<rule> over resources.default
    (runtime in minutes, mem_mb, gpu); `gpu` where params decide elsewhere (train.gpus, backbone)."""
    spec = {**config["resources"]["default"], **config["resources"].get(rule, {})}
    gpus = spec.pop("gpus", 0)
    return {**spec, "gpu": gpus if gpu is None else gpu}


def check_resources(rules):
    """resources: names rules of this workflow, and leaves the GPUs params decide elsewhere alone."""
    # every rule the workflow can define (some only for datasets that need them), curves_<ds> as curves
    names = {re.sub(r"^curves_.*", "curves", rule.name) for rule in rules}
    names |= set(re.findall(r"^\s*rule (\w+):", "".join(p.read_text() for p in Path(workflow.basedir, "workflow", "rules").glob("*.smk")), re.M))
    for key, spec in config["resources"].items():
        if key != "default" and key not in names:
            raise WorkflowError(f"{PARAMS}: resources.{key}: no rule of that name; rules: {', '.join(sorted(names))}")
    for key, where in (("train", "train.gpus"), ("features", "the dataset's backbone")):
        if "gpus" in config["resources"].get(key, {}):
            raise WorkflowError(f"{PARAMS}: resources.{key}.gpus: {key}'s GPUs come from {where}; drop it")


def one_of(names):
    return "|".join(re.escape(name) for name in names) or "none"


wildcard_constraints:
    dataset=one_of(DATASETS),
    run=one_of({run for _, run in PLAN.jobs}),
    shard=r"\d+",


def dataset(wildcards):
    return DATASETS[wildcards.dataset]


def shared(paths, spec):
    """A real dataset's raw files and media: the project's, read by every claims seed where they are
    (`local` keeps a module's prefix off them); a generated dataset's are its own workflow's."""
    return paths if spec.generate else [local(path) for path in paths]


def raw_files(wildcards):
    return shared(list(dataset(wildcards).raw_files), dataset(wildcards))


def media_root(wildcards):
    return shared([dataset(wildcards).media_root], dataset(wildcards))


def synthesize_settings(wildcards):
    entry = {k: v for k, v in config["datasets"][wildcards.dataset].items() if k not in ("vocab", "runs", "tables", "published")}
    return {"synthetic": config["synthetic"], "dataset": entry, "seed": config["seed"]}


def prepare_settings(wildcards):
    """Video datasets drop undecodable GIFs at prepare time, by features.video's policy."""
    return params_mod.dataset_features(config, wildcards.dataset)["video"] if dataset(wildcards).format == "tgif" else {}


def features_settings(wildcards):
    """What a dataset's feature extraction reads of params: features:, its backbone and video overrides."""
    return params_mod.dataset_features(config, wildcards.dataset)


def features_file(wildcards):
    return dataset(wildcards).features


def features_gpus(wildcards):
    return 0 if dataset(wildcards).backbone in wp.CPU_BACKBONES else 1


def shard_files(wildcards):
    return [dataset(wildcards).shard(shard) for shard in config["features"]["shards"]]


# backbone bottomup: the features file is converted from the dataset's TSV files, not extracted in shards
BOTTOMUP_DATASETS = [ds for ds, spec in DATASETS.items() if spec.bottomup]
EXTRACTED_BACKBONES = sorted({spec.backbone for spec in DATASETS.values() if not spec.bottomup})


def bottomup_tsv(wildcards):
    return shared(list(dataset(wildcards).bottomup_tsv), dataset(wildcards))


def train_job(wildcards):
    return PLAN.job(wildcards.dataset, wildcards.run)


TRAIN_PRIORITY = train_priorities(PLAN)
# the data rules (synthesize .. features): every training job of their dataset waits on them
DATA_PRIORITY = 1 + max(TRAIN_PRIORITY.values(), default=0)


def train_priority(wildcards):
    """Runs that others start from first, the more waiting the earlier; among equals the longest
    (caprl.workflow.priority)."""
    return TRAIN_PRIORITY[(wildcards.dataset, wildcards.run)]


def init_checkpoints(wildcards):
    """Each role's starting checkpoint: runs/<dataset>/<run>/best.pt of its init run."""
    return list(train_job(wildcards).init.values())


def init_args(wildcards):
    return " ".join(f"--init {role}={here(path)}" for role, path in train_job(wildcards).init.items())


def evaluate_start(wildcards):
    """The checkpoint the run started from (its init.model), whose KL the evaluation measures; none for XE."""
    start = train_job(wildcards).start
    return [start] if start else []


def evaluate_start_args(wildcards):
    start = train_job(wildcards).start
    return f"--start {here(start)}" if start else ""


def run_settings(wildcards):
    """The params a run depends on (the plan's TrainJob.settings, the keys DVC's stage lists too):
    a change re-runs it (Snakemake's params trigger)."""
    return train_job(wildcards).settings(PLAN.params)


def tuning_histories(wildcards):
    """The histories of the dataset's tuning points (tuning.runs)."""
    return [job.history for jobs in PLAN.tuning_points(wildcards.dataset).values() for job in jobs]


def tuning_settings(wildcards):
    """What the tuning report depends on besides the histories: the grids and the runs' values."""
    return {"tuning": config.get("tuning"), "runs": {run: config["runs"].get(run) for run in config.get("tuning", {}).get("runs", {})}}


def table_scores(wildcards):
    """Every score file of the dataset, and the retrieval results of its runs with a listener."""
    return PLAN.scores(wildcards.dataset) + PLAN.retrieval_files(wildcards.dataset)


def table_inputs(wildcards):
    """What a table reads: table_scores, and the gold-caption retrieval results of the listener runs."""
    return PLAN.table_inputs(wildcards.dataset)


def table_settings(wildcards):
    """What a table depends on besides the score files (a change rebuilds it)."""
    return {"tables": PLAN.tables(wildcards.dataset), "runs": RUNS, "dataset": config["datasets"][wildcards.dataset],
            "discriminative": config["discriminative"]}


def evaluate_settings(wildcards):
    """What an evaluation depends on: evaluate:, the run's decoding (decode: + its own), the dataset's clip_score."""
    return {"evaluate": config["evaluate"], "decode": train_job(wildcards).spec.decode,
            "clip_score": config["datasets"][wildcards.dataset].get("clip_score")}


def embedding_inputs(files, ds):
    """What an embedding reads (a listener run's best.pt, or a real dataset's media: the project's)."""
    media = DATASETS[ds].media_root
    return [p for p in files.values() if p != media] + shared([media] if media in files.values() else [], DATASETS[ds])


def embedding_args(files, ds):
    media = DATASETS[ds].media_root
    return wp.embedding_args({flag: p if p == media and not DATASETS[ds].generate else here(p) for flag, p in files.items()})


def evaluate_embedding_files(wildcards):
    """What CLIP-S's embedding reads (a listener run's best.pt, or the raw images): the plan's, as dvc.yaml's."""
    return embedding_inputs(PLAN.evaluate_embedding(wildcards.dataset), wildcards.dataset)


def evaluate_embedding_args(wildcards):
    return embedding_args(PLAN.evaluate_embedding(wildcards.dataset), wildcards.dataset)


def train_embedding_files(wildcards):
    """What the embedding of the run's clip_s reward reads (none for other rewards)."""
    return embedding_inputs(PLAN.train_embedding(train_job(wildcards)), wildcards.dataset)


def train_embedding_args(wildcards):
    return embedding_args(PLAN.train_embedding(train_job(wildcards)), wildcards.dataset)


def attention_checkpoint(wildcards):
    return PLAN.attention_job(wildcards.dataset).checkpoint


# `snakemake --report report.html` groups what it shows by dataset (category) and by paper
# (subcategory: shared SPEC's papers); captions are in workflow/report/.
PAPERS = {
    "main": "All methods (main table)",
    "stackcap": "000 Stack-Captioning, coarse-to-fine (Gu et al., AAAI 2018)",
    "pg_spider": "001 PG-SPIDEr (Liu et al., ICCV 2017)",
    "sle": "002 Sequence-level exploration, SLL-SLE (Chen & Jin, CVPR 2020)",
    "ac": "003 Actor-critic, embedding reward (Shi et al.; Ren et al., CVPR 2017)",
    "psst": "004 PSST, partial-sampling straight-through",
    "curves": "Learning curves (every training run)",
}


def outputs_folder(wildcards, output):
    """The one folder holding a job's outputs: the --out-dir of its stage."""
    folders = {os.path.dirname(path) for path in output}
    if len(folders) != 1:
        raise WorkflowError(f"outputs in several folders: {sorted(folders)}")
    return folders.pop()


def table_paper(wildcards):
    """The report subcategory of a table: its paper, from the name (stackcap_table1: Stack-Cap)."""
    prefix = next((p for p in PAPERS if wildcards.table == p or wildcards.table.startswith(f"{p}_")), None)
    return PAPERS[prefix] if prefix else "Other tables"


def curves_folder(wildcards, output):
    """--out-dir of `caprl curves`: the folder of the runs' PNG and CSV files."""
    return outputs_folder(wildcards, output.runs)


def curve_outputs(dataset):
    """Per trained run of ``dataset``: its PNG (in the report, labelled by the run) and its CSV."""
    files = []
    for job in PLAN.trained(dataset):
        png = wp.CURVES_PNG.format(dataset=dataset, run=job.run)
        files += [report(png, caption="../report/curves.rst", category=dataset, subcategory=PAPERS["curves"],
                         labels={"result": job.run}),
                  wp.CURVES_CSV.format(dataset=dataset, run=job.run)]
    return files
