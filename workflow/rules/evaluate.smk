rule evaluate:
    input:
        checkpoint=f"runs/{DS}/{{run}}/best.pt",
        refs=REFS,
        annotations=ANNOTATIONS,
        vocab=VOCAB,
        labels=LABELS,
        features=FEATURES,
    output:
        captions=f"{RESULTS}/{{run}}/captions.json",
        scores=f"{RESULTS}/{{run}}/scores.json",
        examples=f"{RESULTS}/{{run}}/examples.json",
    params:
        settings={"evaluate": config["evaluate"], "decode": config["decode"]},
    log:
        f"logs/{DS}/evaluate/{{run}}.log",
    shell:
        "caprl evaluate --params {PARAMS} --log {log} --run {wildcards.run} --checkpoint {input.checkpoint}"
        " --annotations {input.annotations} --vocab {input.vocab} --labels {input.labels} --features {input.features}"
        " --refs {input.refs} --out-captions {output.captions} --out-scores {output.scores} --out-examples {output.examples}"


rule baseline:
    input:
        refs=REFS,
        annotations=ANNOTATIONS,
    output:
        captions=f"{RESULTS}/most-frequent/captions.json",
        scores=f"{RESULTS}/most-frequent/scores.json",
        examples=f"{RESULTS}/most-frequent/examples.json",
    params:
        settings={"evaluate": config["evaluate"]},
    log:
        f"logs/{DS}/evaluate/most-frequent.log",
    shell:
        "caprl baseline --params {PARAMS} --log {log} --annotations {input.annotations} --refs {input.refs}"
        " --out-captions {output.captions} --out-scores {output.scores} --out-examples {output.examples}"
