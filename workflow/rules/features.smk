# Per dataset: one extraction job per shard with the dataset's backbone, then one merge; with
# backbone bottomup, one conversion of bottom-up-attention's TSV files instead.
rule features:
    input:
        annotations=wp.ANNOTATIONS,
        images=media_root,
    output:
        wp.SHARD,
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
        backbone=one_of(EXTRACTED_BACKBONES),
    params:
        settings=features_settings,
    log:
        "logs/{dataset}/features_{backbone}_{shard}.log",
    priority: DATA_PRIORITY
    resources:
        **job_resources("features", gpu=features_gpus),
    shell:
        "caprl features --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --annotations {input.annotations}"
        " --image-root {input.images} --shard {wildcards.shard} --out {output}"


rule merge_features:
    input:
        annotations=wp.ANNOTATIONS,
        shards=shard_files,
    output:
        wp.FEATURES,
    wildcard_constraints:
        dataset=one_of(OWN_DATA),
        backbone=one_of(EXTRACTED_BACKBONES),
    params:
        shard_dir=here(wp.SHARD_DIR),
    log:
        "logs/{dataset}/merge_features_{backbone}.log",
    priority: DATA_PRIORITY
    resources:
        **job_resources("merge_features"),
    shell:
        "caprl merge-features --params " + PARAMS + " --log {log} --annotations {input.annotations} --shard-dir {params.shard_dir}"
        " --out {output}"


if BOTTOMUP_DATASETS:

    rule bottomup_features:
        input:
            annotations=wp.ANNOTATIONS,
            tsv=bottomup_tsv,
        output:
            wp.FEATURES,
        wildcard_constraints:
            dataset=one_of([ds for ds in BOTTOMUP_DATASETS if ds in OWN_DATA]),
            backbone=wp.BOTTOMUP,
        log:
            "logs/{dataset}/features_{backbone}.log",
        priority: DATA_PRIORITY
        resources:
            **job_resources("bottomup_features"),
        shell:
            "caprl bottomup --params " + PARAMS + " --log {log} --tsv {input.tsv} --annotations {input.annotations}"
            " --dataset {wildcards.dataset} --out {output}"
