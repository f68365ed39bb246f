# Paths and helpers shared by the rules. params.yaml is the only source of parameters:
# every stage reads it (PARAMS) and validates it again.
import os

PARAMS = "params.yaml"
DS = config["dataset"]["name"]
BACKBONE = config["features"]["backbone"]
RUNS_XE = config["runs"]["xe"]
RUNS_RL = config["runs"]["rl"]
ALL_RUNS = list(RUNS_XE) + list(RUNS_RL)
# GPUs per job where params.yaml decides (the SLURM profile gives the others): a training
# job runs train.gpus DDP processes; features runs a CNN backbone on a GPU, patches on CPU.
TRAIN_GPUS = config["train"]["gpus"]
FEATURES_GPUS = 0 if BACKBONE == "patches" else 1

RAW_JSON = config["dataset"]["karpathy_json"]
IMAGE_ROOT = config["dataset"]["image_root"]
ANNOTATIONS = f"data/{DS}/annotations.json"
VOCAB = f"data/{DS}/vocab.json"
LABELS = f"data/{DS}/labels.h5"
CIDER_DF = f"data/{DS}/cider_df.json"
SHARD_DIR = f"data/{DS}/features/{BACKBONE}"
FEATURES = f"data/{DS}/features_{BACKBONE}.h5"
RESULTS = f"results/{DS}"
REFS = f"data/{DS}/refs_{config['evaluate']['split']}.json"
TABLE_FILES = expand("results/tables/{ds}_{table}.{ext}", ds=DS, table=config["tables"], ext=["md", "csv", "tex"])

if not config["dataset"]["synthetic"] and not os.path.exists(RAW_JSON):
    raise WorkflowError(
        f"dataset.karpathy_json: {RAW_JSON} does not exist. Put the Karpathy split file there "
        f"(dataset_coco.json / dataset_flickr30k.json from Karpathy's caption_datasets release) and the "
        f"images under {IMAGE_ROOT}, or set dataset.synthetic: true. See README.md, 'Real data'."
    )

wildcard_constraints:
    run="|".join(ALL_RUNS) or "none",
    shard=r"\d+",


def init_checkpoint(wildcards):
    """RL runs start from their XE run's best checkpoint; XE runs from scratch."""
    spec = RUNS_RL.get(wildcards.run)
    return [f"runs/{DS}/{spec['init']}/best.pt"] if spec else []


def init_arg(wildcards):
    return " ".join(f"--init {path}" for path in init_checkpoint(wildcards))


def run_settings(wildcards):
    """The params a run depends on: a change re-runs it (Snakemake's params trigger)."""
    spec = RUNS_XE.get(wildcards.run) or RUNS_RL[wildcards.run]
    objective = spec.get("objective", "xe")
    return {"spec": spec, "model": config["models"][spec["model"]], "objective": config["objectives"][objective],
            "train": config["train"], "decode": config["decode"], "seed": config["seed"]}
