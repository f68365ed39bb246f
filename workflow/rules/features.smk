# Per dataset: one extraction job per shard with the dataset's backbone, then one merge.
rule features:
    input:
        annotations=wp.ANNOTATIONS,
        images=media_root,
    output:
        wp.SHARD,
    params:
        settings=config["features"],
    log:
        "logs/{dataset}/features_{backbone}_{shard}.log",
    resources:
        gpu=features_gpus,
    shell:
        "caprl features --params {PARAMS} --log {log} --dataset {wildcards.dataset} --annotations {input.annotations}"
        " --image-root {input.images} --shard {wildcards.shard} --out {output}"


rule merge_features:
    input:
        annotations=wp.ANNOTATIONS,
        shards=shard_files,
    output:
        wp.FEATURES,
    params:
        shard_dir=wp.SHARD_DIR,
    log:
        "logs/{dataset}/merge_features_{backbone}.log",
    shell:
        "caprl merge-features --params {PARAMS} --log {log} --annotations {input.annotations} --shard-dir {params.shard_dir}"
        " --out {output}"
