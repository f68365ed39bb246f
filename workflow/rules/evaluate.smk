# Per dataset: every run whose objective yields a caption model, and the trivial baseline. The
# score file also holds the validation numbers of the epoch the checkpoint holds, read from the
# checkpoint (caprl.evaluation.validation): the validation curves of paper 004's tables.
rule evaluate:
    input:
        checkpoint=wp.CHECKPOINT,
        refs=expand(wp.REFS, dataset="{dataset}", split=EVAL_SPLIT),
        annotations=wp.ANNOTATIONS,
        vocab=wp.VOCAB,
        labels=wp.LABELS,
        features=features_file,
        embedding=evaluate_embedding_files,
        start=evaluate_start,
    output:
        captions=wp.CAPTIONS,
        scores=wp.SCORES,
        examples=wp.EXAMPLES,
    params:
        settings=evaluate_settings,
        embedding=evaluate_embedding_args,
        start=evaluate_start_args,
    log:
        "logs/{dataset}/evaluate/{run}.log",
    group:
        "evaluation"
    resources:
        **job_resources("evaluate"),
    shell:
        "caprl evaluate --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --run {wildcards.run}"
        " --checkpoint {input.checkpoint} --annotations {input.annotations} --vocab {input.vocab} --labels {input.labels}"
        " --features {input.features} --refs {input.refs} --out-captions {output.captions} --out-scores {output.scores}"
        " --out-examples {output.examples} {params.embedding} {params.start}"


rule baseline:
    input:
        refs=expand(wp.REFS, dataset="{dataset}", split=EVAL_SPLIT),
        annotations=wp.ANNOTATIONS,
    output:
        captions=expand(wp.CAPTIONS, dataset="{dataset}", run=wp.BASELINE_RUN),
        scores=expand(wp.SCORES, dataset="{dataset}", run=wp.BASELINE_RUN),
        examples=expand(wp.EXAMPLES, dataset="{dataset}", run=wp.BASELINE_RUN),
    params:
        settings={"evaluate": config["evaluate"]},
    log:
        f"logs/{{dataset}}/evaluate/{wp.BASELINE_RUN}.log",
    resources:
        **job_resources("baseline"),
    shell:
        "caprl baseline --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --annotations {input.annotations}"
        " --refs {input.refs} --out-captions {output.captions} --out-scores {output.scores} --out-examples {output.examples}"


# Per run whose checkpoint holds a listener (paper 004): its evaluated captions ranked by its
# listener against every image of the evaluation split (recall@1/5/10, mean rank).
RETRIEVED_RUNS = sorted({job.run for ds in DATASETS for job in PLAN.retrieved(ds)})

if RETRIEVED_RUNS:

    rule retrieval:
        input:
            checkpoint=wp.CHECKPOINT,
            captions=wp.CAPTIONS,
            annotations=wp.ANNOTATIONS,
            vocab=wp.VOCAB,
            labels=wp.LABELS,
            features=features_file,
        output:
            wp.RETRIEVAL,
        wildcard_constraints:
            run=one_of(RETRIEVED_RUNS),
        params:
            settings={"split": EVAL_SPLIT, "listener": config["listener"]},
        log:
            "logs/{dataset}/retrieval/{run}.log",
        group:
            "evaluation"
        resources:
            **job_resources("retrieval"),
        shell:
            "caprl retrieval --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --run {wildcards.run}"
            " --checkpoint {input.checkpoint} --captions {input.captions} --annotations {input.annotations}"
            " --vocab {input.vocab} --labels {input.labels} --features {input.features} --out {output}"


# Per run that pre-trains a listener alone (its objective's gold_retrieval, e.g. method listener):
# its listener ranks every image of the evaluation split by the image's first gold caption (the
# caption its validation recall uses), into the same retrieval.json: the tables' upper reference.
GOLD_RETRIEVED_RUNS = sorted({job.run for ds in DATASETS for job in PLAN.gold_retrieved(ds)})

if GOLD_RETRIEVED_RUNS:

    rule gold_retrieval:
        input:
            checkpoint=wp.CHECKPOINT,
            annotations=wp.ANNOTATIONS,
            vocab=wp.VOCAB,
            labels=wp.LABELS,
            features=features_file,
        output:
            wp.RETRIEVAL,
        wildcard_constraints:
            run=one_of(GOLD_RETRIEVED_RUNS),
        params:
            settings={"split": EVAL_SPLIT, "listener": config["listener"]},
        log:
            "logs/{dataset}/retrieval/{run}.log",
        resources:
            **job_resources("gold_retrieval"),
        shell:
            "caprl retrieval --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --run {wildcards.run}"
            " --checkpoint {input.checkpoint} --gold --annotations {input.annotations} --vocab {input.vocab}"
            " --labels {input.labels} --features {input.features} --out {output}"
