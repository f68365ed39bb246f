# Per dataset and table (datasets.<name>.tables, or tables:): one job reads the evaluated
# runs' score files and retrieval results (and the listener runs' gold-caption retrieval results)
# and writes results/tables/<dataset>_<table>.{md,csv,tex}. A score file carries the validation
# numbers of its checkpoint's epoch too (evaluate.smk): paper 004's auto operating points are
# chosen on them, so no other file is read. The report shows the CSV (its caption renders it as a
# table), under the dataset and the table's paper.
rule tables:
    input:
        scores=table_inputs,
    output:
        md=wp.TABLE.replace("{ext}", "md"),
        csv=report(wp.TABLE.replace("{ext}", "csv"), caption="../report/table.rst", category="{dataset}",
                   subcategory=table_paper, labels={"result": "table {table}"}),
        tex=wp.TABLE.replace("{ext}", "tex"),
    wildcard_constraints:
        table=one_of(TABLE_NAMES),
    params:
        params_file=PARAMS,
        results=here(wp.RESULTS),
        out_dir=outputs_folder,
        settings=table_settings,
    log:
        "logs/{dataset}/tables_{table}.log",
    resources:
        **job_resources("tables"),
    shell:
        "caprl tables --params {params.params_file} --log {log} --dataset {wildcards.dataset} --table {wildcards.table}"
        " --results-dir {params.results} --out-dir {params.out_dir}"
