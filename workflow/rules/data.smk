if config["dataset"]["synthetic"]:

    rule synthesize:
        output:
            json=RAW_JSON,
            images=directory(IMAGE_ROOT),
        params:
            settings=config["synthetic"],
            seed=config["seed"],
        log:
            f"logs/{DS}/synthesize.log",
        shell:
            "caprl synthesize --params {PARAMS} --log {log} --out-json {output.json} --image-dir {output.images}"


rule prepare:
    input:
        json=RAW_JSON,
        images=IMAGE_ROOT,
    output:
        ANNOTATIONS,
    log:
        f"logs/{DS}/prepare.log",
    shell:
        "caprl prepare --params {PARAMS} --log {log} --karpathy-json {input.json} --image-root {input.images} --out {output}"


rule vocab:
    input:
        ANNOTATIONS,
    output:
        vocab=VOCAB,
        labels=LABELS,
    params:
        settings=config["vocab"],
    log:
        f"logs/{DS}/vocab.log",
    shell:
        "caprl vocab --params {PARAMS} --log {log} --annotations {input} --out-vocab {output.vocab} --out-labels {output.labels}"


rule references:
    input:
        ANNOTATIONS,
    output:
        f"data/{DS}/refs_{{split}}.json",
    log:
        f"logs/{DS}/references_{{split}}.log",
    shell:
        "caprl references --params {PARAMS} --log {log} --annotations {input} --split {wildcards.split} --out {output}"


rule cider_df:
    input:
        ANNOTATIONS,
    output:
        CIDER_DF,
    log:
        f"logs/{DS}/cider_df.log",
    shell:
        "caprl cider-df --params {PARAMS} --log {log} --annotations {input} --split train --out {output}"
