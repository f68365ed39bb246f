# Per dataset: its tables (datasets.<name>.tables, or tables:) from the evaluated runs' score files.
# One rule per dataset, as each dataset may have its own list of tables.
for _ds in DATASETS:

    rule:
        name:
            f"tables_{_ds}"
        input:
            scores=PLAN.scores(_ds),
            figures=PLAN.attention_pngs(_ds),
        output:
            PLAN.table_files(_ds),
        params:
            dataset=_ds,  # params are evaluated here; the shell string only when the job runs
            results=wp.RESULTS.format(dataset=_ds),
            out_dir=wp.TABLES_DIR,
            settings={"tables": PLAN.tables(_ds), "runs": config["runs"]},
        log:
            f"logs/{_ds}/tables.log",
        shell:
            "caprl tables --params {PARAMS} --log {log} --dataset {params.dataset} --results-dir {params.results}"
            " --out-dir {params.out_dir}"
