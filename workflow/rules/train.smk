rule train:
    input:
        annotations=ANNOTATIONS,
        vocab=VOCAB,
        labels=LABELS,
        features=FEATURES,
        cider_df=CIDER_DF,
        init=init_checkpoint,
    output:
        checkpoint=f"runs/{DS}/{{run}}/best.pt",
        history=f"runs/{DS}/{{run}}/history.json",
    params:
        settings=run_settings,
        init=init_arg,
        state=f"runs/{DS}/{{run}}/state",
    log:
        f"logs/{DS}/train/{{run}}.log",
    resources:
        gpu=TRAIN_GPUS,
    shell:
        "caprl train --params {PARAMS} --log {log} --run {wildcards.run} --annotations {input.annotations}"
        " --vocab {input.vocab} --labels {input.labels} --features {input.features} --cider-df {input.cider_df}"
        " {params.init} --checkpoint {output.checkpoint} --history {output.history} --state-dir {params.state}"
