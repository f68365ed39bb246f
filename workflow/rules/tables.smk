# Per dataset and table (datasets.<name>.tables, or tables:): one job reads the evaluated
# runs' score files and writes results/tables/<dataset>_<table>.{md,csv,tex}.
rule tables:
    input:
        scores=table_scores,
    output:
        md=wp.TABLE.replace("{ext}", "md"),
        csv=wp.TABLE.replace("{ext}", "csv"),
        tex=wp.TABLE.replace("{ext}", "tex"),
    wildcard_constraints:
        table=one_of(TABLE_NAMES),
    params:
        results=wp.RESULTS,
        out_dir=wp.TABLES_DIR,
        settings=table_settings,
    log:
        "logs/{dataset}/tables_{table}.log",
    shell:
        "caprl tables --params {PARAMS} --log {log} --dataset {wildcards.dataset} --table {wildcards.table}"
        " --results-dir {params.results} --out-dir {params.out_dir}"
