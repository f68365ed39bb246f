rule tables:
    input:
        scores=expand(f"{RESULTS}/{{run}}/scores.json", run=ALL_RUNS + ["most-frequent"]),
        figures=ATTENTION_PNGS,
    output:
        TABLE_FILES,
    params:
        settings={"tables": config["tables"], "runs": config["runs"]},
    log:
        f"logs/{DS}/tables.log",
    shell:
        "caprl tables --params {PARAMS} --log {log} --results-dir {RESULTS} --out-dir results/tables"
