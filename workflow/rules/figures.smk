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
