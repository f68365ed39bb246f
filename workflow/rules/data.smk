# Per dataset: raw files (generated or yours) -> annotations -> vocabulary, references, CIDEr-D df.
if GENERATED_IMAGES:

    rule synthesize:
        output:
            json=wp.GENERATED_RAW,
            images=directory(wp.GENERATED_MEDIA),
        wildcard_constraints:
            dataset=one_of(GENERATED_IMAGES),
        params:
            settings=synthesize_settings,
        log:
            "logs/{dataset}/synthesize.log",
        priority: DATA_PRIORITY
        resources:
            **job_resources("synthesize"),
        shell:
            "caprl synthesize --params " + PARAMS + " --log {log} --dataset {wildcards.dataset}"
            " --out-raw {output.json} --media-dir {output.images}"


if GENERATED_VIDEOS:

    rule synthesize_video:
        output:
            tsv=wp.GENERATED["tgif"][0],
            splits=[f"data/raw/{{dataset}}/{name}" for name in wp.RAW_SIDE_FILES["tgif"]],
            gifs=directory(wp.GENERATED["tgif"][1]),
        wildcard_constraints:
            dataset=one_of(GENERATED_VIDEOS),
        params:
            settings=synthesize_settings,
        log:
            "logs/{dataset}/synthesize.log",
        priority: DATA_PRIORITY
        resources:
            **job_resources("synthesize_video"),
        shell:
            "caprl synthesize --params " + PARAMS + " --log {log} --dataset {wildcards.dataset}"
            " --out-raw {output.tsv} --media-dir {output.gifs}"


rule prepare:
    input:
        raw=raw_files,
        media=media_root,
    output:
        wp.ANNOTATIONS,
    params:
        settings=prepare_settings,
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
    log:
        "logs/{dataset}/prepare.log",
    priority: DATA_PRIORITY
    group:
        "data"
    resources:
        **job_resources("prepare"),
    shell:
        "caprl prepare --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --raw {input.raw[0]}"
        " --media-root {input.media} --out {output}"


from caprl.params import dataset_vocab


rule vocab:
    input:
        wp.ANNOTATIONS,
    output:
        vocab=wp.VOCAB,
        labels=wp.LABELS,
    params:
        # vocab: with datasets.<name>.vocab on top: a change reruns only that dataset's vocabulary
        settings=lambda wildcards: dataset_vocab(config, wildcards.dataset),
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
    log:
        "logs/{dataset}/vocab.log",
    priority: DATA_PRIORITY
    group:
        "data"
    resources:
        **job_resources("vocab"),
    shell:
        "caprl vocab --params " + PARAMS + " --log {log} --annotations {input} --out-vocab {output.vocab} --out-labels {output.labels}"


rule references:
    input:
        wp.ANNOTATIONS,
    output:
        wp.REFS,
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
    log:
        "logs/{dataset}/references_{split}.log",
    priority: DATA_PRIORITY
    resources:
        **job_resources("references"),
    shell:
        "caprl references --params " + PARAMS + " --log {log} --annotations {input} --split {wildcards.split} --out {output}"


rule cider_df:
    input:
        wp.ANNOTATIONS,
    output:
        wp.CIDER_DF,
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
    log:
        "logs/{dataset}/cider_df.log",
    priority: DATA_PRIORITY
    resources:
        **job_resources("cider_df"),
    shell:
        "caprl cider-df --params " + PARAMS + " --log {log} --annotations {input} --split train --out {output}"


if SHARED_DATA:

    rule shared_data:  # a claims seed's copy of the project's data of a real dataset: a hard link (one file, whatever the seeds)
        input:
            local("data/{dataset}/{file}"),
        output:
            "data/{dataset}/{file}",
        wildcard_constraints:
            dataset=one_of(SHARED_DATA),
            file=r"[^/]+",
        localrule: True
        shell:
            "ln -f {input:q} {output:q} 2>/dev/null || (cp -p {input:q} {output:q}.part && mv {output:q}.part {output:q})"
