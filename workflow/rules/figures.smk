# Stack-Cap Fig. 3, per dataset: every stage's greedy caption with its per-word attention maps,
# for the first figures.attention_images images of the evaluation split, drawn from the first
# run of the dataset with method c2f and a model of arch stackcap (none: no figure).
ATTENTION_DATASETS = [ds for ds in DATASETS if PLAN.attention_job(ds)]

if ATTENTION_DATASETS:

    rule attention_figure:
        input:
            checkpoint=attention_checkpoint,
            annotations=wp.ANNOTATIONS,
            vocab=wp.VOCAB,
            labels=wp.LABELS,
            features=features_file,
            images=media_root,
        output:
            expand(wp.ATTENTION_PNG, dataset="{dataset}", k=range(config["figures"]["attention_images"])),
        wildcard_constraints:
            dataset=one_of(ATTENTION_DATASETS),
        params:
            n=config["figures"]["attention_images"],
            out_dir=wp.ATTENTION_DIR,
            settings={"figures": config["figures"], "evaluate": config["evaluate"], "decode": config["decode"]},
        log:
            "logs/{dataset}/attention_figure.log",
        shell:
            "caprl attention-figure --params {PARAMS} --log {log} --dataset {wildcards.dataset} --checkpoint {input.checkpoint}"
            " --annotations {input.annotations} --features {input.features} --vocab {input.vocab}"
            " --labels {input.labels} --image-root {input.images} --out-dir {params.out_dir} --n-images {params.n}"


# Paper 004's Fig. 3 (recall@10 against each language metric, one curve per method over its
# lam points) and Fig. 4 (recall@10 at a fixed CIDEr-D against rho), per dataset with runs
# that hold a listener.
PSST_DATASETS = [ds for ds in DATASETS if PLAN.psst_pngs(ds)]

if PSST_DATASETS:

    rule psst_figures:
        input:
            table_scores,
        output:
            expand(wp.PSST_PNG, dataset="{dataset}", figure=wp.PSST_FIGURES),
        wildcard_constraints:
            dataset=one_of(PSST_DATASETS),
        params:
            results=wp.RESULTS,
            out_dir=wp.FIGURES_DIR,
            settings=table_settings,
        log:
            "logs/{dataset}/psst_figures.log",
        shell:
            "caprl psst-figures --params {PARAMS} --log {log} --dataset {wildcards.dataset}"
            " --results-dir {params.results} --out-dir {params.out_dir}"
