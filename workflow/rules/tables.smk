# Per dataset: every table of params.yaml `tables:` from the evaluated runs' score files.
rule tables:
    input:
        scores=table_scores,
        figures=attention_pngs,
    output:
        expand(wp.TABLE, dataset="{dataset}", table=config["tables"], ext=wp.TABLE_FORMATS),
    params:
        results=wp.RESULTS,
        settings={"tables": config["tables"], "runs": config["runs"]},
    log:
        "logs/{dataset}/tables.log",
    shell:
        "caprl tables --params {PARAMS} --log {log} --dataset {wildcards.dataset} --results-dir {params.results}"
        f" --out-dir {wp.TABLES_DIR}"
