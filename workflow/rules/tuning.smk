# `snakemake tuning`: per dataset, every point of tuning.runs trains (the train rule, one job
# per point) and one job reads their histories: each tuned run's choice on the validation
# split, results/tuning/<dataset>.{md,json}. Not part of all_tables; no test-split output.
rule tune_report:
    input:
        histories=tuning_histories,
    output:
        md=wp.TUNING.replace("{ext}", "md"),
        json=wp.TUNING.replace("{ext}", "json"),
    params:
        settings=tuning_settings,
    log:
        "logs/{dataset}/tune_report.log",
    resources:
        **job_resources("tune_report"),
    shell:
        "caprl tune-report --params " + PARAMS + " --log {log} --dataset {wildcards.dataset} --out-md {output.md}"
        " --out-json {output.json}"
