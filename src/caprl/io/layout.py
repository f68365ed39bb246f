"""Where every stage reads and writes, relative to the working directory: the pipeline's file
layout, one place for the plan (:mod:`caprl.workflow.plan`, which re-exports these names), the
Snakefile, the DVC writer and the stages that find a file by its run and dataset."""

RAW_LOGS = "logs/{dataset}"
ANNOTATIONS = "data/{dataset}/annotations.json"
VOCAB = "data/{dataset}/vocab.json"
LABELS = "data/{dataset}/labels.h5"
CIDER_DF = "data/{dataset}/cider_df.json"
REFS = "data/{dataset}/refs_{split}.json"
SHARD_DIR = "data/{dataset}/features/{backbone}"
SHARD = "data/{dataset}/features/{backbone}/shard{shard}.h5"
FEATURES = "data/{dataset}/features_{backbone}.h5"
CHECKPOINT = "runs/{dataset}/{run}/best.pt"
HISTORY = "runs/{dataset}/{run}/history.json"
STATE_DIR = "runs/{dataset}/{run}/state"
RESULTS = "results/{dataset}"
CAPTIONS = "results/{dataset}/{run}/captions.json"
SCORES = "results/{dataset}/{run}/scores.json"
EXAMPLES = "results/{dataset}/{run}/examples.json"
RETRIEVAL = "results/{dataset}/{run}/retrieval.json"
FIGURES_DIR = "results/figures/{dataset}"
PSST_FIGURES = ("psst_fig3", "psst_fig4")  # paper 004's Fig. 3 and Fig. 4
PSST_PNG = "results/figures/{dataset}/{figure}.png"
ATTENTION_DIR = "results/figures/{dataset}/attention"
ATTENTION_PNG = "results/figures/{dataset}/attention/attention_{k}.png"
# `caprl curves`, per dataset: every trained run's learning curves (PNG) and their series (CSV:
# dataset, run, epoch, train_loss, val_cider), and the validation CIDEr-D of every run in one PNG
CURVES_DIR = "results/figures/{dataset}/curves"
CURVES_PNG = "results/figures/{dataset}/curves/{run}.png"
CURVES_CSV = "results/figures/{dataset}/curves/{run}.csv"
CURVES_OVERVIEW = "results/figures/{dataset}/curves_val_cider.png"
TABLES_DIR = "results/tables"
TABLE = "results/tables/{dataset}_{table}.{ext}"
TABLE_FORMATS = ("md", "csv", "tex")
TUNING = "results/tuning/{dataset}.{ext}"  # `caprl tune-report`: every tuning point's validation score, the choice
