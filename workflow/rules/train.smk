# Per (dataset, run) of the plan: runs with an `init` start from those runs' best checkpoints.
rule train:
    input:
        annotations=wp.ANNOTATIONS,
        vocab=wp.VOCAB,
        labels=wp.LABELS,
        features=features_file,
        cider_df=wp.CIDER_DF,
        init=init_checkpoints,
        embedding=train_embedding_files,
    output:
        checkpoint=wp.CHECKPOINT,
        history=wp.HISTORY,
    params:
        settings=run_settings,
        init=init_args,
        state=here(wp.STATE_DIR),
        embedding=train_embedding_args,
    priority: train_priority
    log:
        "logs/{dataset}/train/{run}.log",
    resources:
        **job_resources("train", gpu=TRAIN_GPUS),
    shell:
        "caprl train --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --run {wildcards.run}"
        " --annotations {input.annotations} --vocab {input.vocab} --labels {input.labels} --features {input.features}"
        " --cider-df {input.cider_df} {params.init} --checkpoint {output.checkpoint} --history {output.history}"
        " --state-dir {params.state} {params.embedding}"
