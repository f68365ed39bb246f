# On demand, outside all_tables: `snakemake --cores 2 caption_folder` captions every image of
# data/caption_images/ (copy or link them there) with every evaluated run of each image dataset,
# results/<dataset>/captions/<run>.json (caprl caption: each run's own backbone and decode:), and
# shows the runs side by side in results/<dataset>/captions/index.html (caprl caption-page).
from caprl.data.readers import media_of

CAPTION_IMAGES = "data/caption_images"
CAPTION_JSON = "results/{dataset}/captions/{run}.json"
CAPTION_PAGE = "results/{dataset}/captions/index.html"
# datasets of still images whose features caprl extracts (bottom-up boxes come from a detector's files)
CAPTION_DATASETS = [ds for ds, spec in DATASETS.items()
                    if media_of(spec.format, ds) == "image" and not spec.bottomup and PLAN.evaluated(ds)]


def caption_files(wildcards):
    """Every evaluated run's captions of the folder, in the plan's order (the page's columns)."""
    return [CAPTION_JSON.format(dataset=wildcards.dataset, run=job.run) for job in PLAN.evaluated(wildcards.dataset)]


def caption_settings(wildcards):
    """What a run's captions depend on besides its checkpoint: its decoding (decode: + its own)."""
    return {"decode": train_job(wildcards).spec.decode, "batch_size": config["evaluate"]["batch_size"]}


if CAPTION_DATASETS:

    rule caption:
        input:
            checkpoint=wp.CHECKPOINT,
            vocab=wp.VOCAB,
            images=CAPTION_IMAGES,
        output:
            CAPTION_JSON,
        wildcard_constraints:
            dataset=one_of(CAPTION_DATASETS),
        params:
            settings=caption_settings,
        log:
            "logs/{dataset}/caption/{run}.log",
        resources:
            **job_resources("caption"),
        shell:
            "caprl caption --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --run {wildcards.run}"
            " --checkpoint {input.checkpoint} --vocab {input.vocab} --images {input.images} --out {output}"

    rule caption_page:
        input:
            captions=caption_files,
            images=CAPTION_IMAGES,
        output:
            CAPTION_PAGE,
        wildcard_constraints:
            dataset=one_of(CAPTION_DATASETS),
        log:
            "logs/{dataset}/caption/index.log",
        resources:
            **job_resources("caption_page"),
        shell:
            "caprl caption-page --params " + PARAMS + " --log {log} --captions {input.captions} --out {output}"


rule caption_folder:  # every image of data/caption_images/, captioned by every run, side by side
    input:
        [CAPTION_PAGE.format(dataset=ds) for ds in CAPTION_DATASETS],
