# caprl: raw data -> features -> vocabulary -> XE -> RL -> evaluation -> tables, for every
# enabled dataset of params.yaml. Every rule runs one `caprl <stage>` command; the jobs come
# from caprl.workflow_plan, which `caprl dvc-yaml` also uses to write dvc.yaml.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


validate(config, "workflow/schemas/params.schema.yaml")


# After `dvc pull`, `dvc checkout` or `dvc commit` (dvc.lock changed), the outputs DVC reports
# up to date get modification times in the DAG's order, so Snakemake re-runs none of them
# (caprl.dvc_sync; a no-op without a new dvc.lock).
if workflow.is_main_process:
    from caprl.dvc_sync import sync_after_dvc

    sync_after_dvc()


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/tuning.smk"


check_resources(workflow.rules)  # resources: in params.yaml names rules of this workflow


rule all_tables:
    default_target: True  # also the target of `snakemake --report report.html`
    input:
        TABLE_FILES,
        FIGURE_FILES,


rule tuning:  # each tuned run's options chosen on the validation split (tuning: in params.yaml)
    input:
        TUNING_FILES,


# One METEOR JVM for all the jobs of a local run (caprl.metrics.meteor_server): each
# `caprl evaluate` would otherwise spend ~6 s of CPU starting its own. Jobs find it through
# $CAPRL_METEOR_SOCKET and fall back to their own JVM without it. Not started on dry runs
# (Snakemake runs no hooks then) nor for cluster executors (jobs on other nodes cannot reach
# it); it exits by itself when Snakemake does, even if neither hook below runs.
onstart:
    if workflow.local_exec:
        from caprl.metrics import meteor_client as meteor_server

        meteor_socket = meteor_server.start_shared(log_path=".snakemake/log/meteor-server.log")
        if meteor_socket:
            logger.info(f"METEOR server for this run's jobs: {meteor_socket}")


onsuccess:
    from caprl.metrics import meteor_client as meteor_server

    meteor_server.stop_shared()


onerror:
    from caprl.metrics import meteor_client as meteor_server

    meteor_server.stop_shared()
