rule features:
    input:
        annotations=ANNOTATIONS,
        images=IMAGE_ROOT,
    output:
        f"{SHARD_DIR}/shard{{shard}}.h5",
    params:
        settings=config["features"],
    log:
        f"logs/{DS}/features_{BACKBONE}_{{shard}}.log",
    resources:
        gpu=FEATURES_GPUS,
    shell:
        "caprl features --params {PARAMS} --log {log} --annotations {input.annotations} --image-root {input.images}"
        " --shard {wildcards.shard} --out {output}"


rule merge_features:
    input:
        annotations=ANNOTATIONS,
        shards=expand(f"{SHARD_DIR}/shard{{shard}}.h5", shard=config["features"]["shards"]),
    output:
        FEATURES,
    log:
        f"logs/{DS}/merge_features_{BACKBONE}.log",
    shell:
        "caprl merge-features --params {PARAMS} --log {log} --annotations {input.annotations} --shard-dir {SHARD_DIR}"
        " --out {output}"
