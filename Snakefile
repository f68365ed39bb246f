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


# Three helpers shared by the jobs of a local run, each found through an environment variable by
# the jobs, which do the work themselves without it: the job server ($CAPRL_JOB_SERVER,
# caprl.job_server) has torch, MLflow and every stage imported and forks each `caprl` job from
# there (~5-8 s of CPU saved per job); one METEOR JVM ($CAPRL_METEOR_SOCKET,
# caprl.metrics.meteor_server; ~6 s per evaluation); one MLflow client ($CAPRL_MLFLOW_RELAY,
# caprl.tracking_store; ~1.5 s per tracked job). Not started on dry runs (Snakemake runs no hooks
# then) nor for cluster executors (jobs on other nodes cannot reach them); they exit by themselves
# when Snakemake does, even if neither hook below runs.
onstart:
    if workflow.local_exec:
        from caprl import job_server, tracking_store
        from caprl.metrics import meteor_client

        for name, service in (("job server", job_server), ("METEOR server", meteor_client),
                              ("MLflow relay", tracking_store)):
            socket_path = service.start_shared(log_path=f".snakemake/log/{service.SERVER_MODULE}.log")
            if socket_path:
                logger.info(f"{name} for this run's jobs: {socket_path}")


onsuccess:
    from caprl import job_server, tracking_store
    from caprl.metrics import meteor_client

    for service in (job_server, meteor_client, tracking_store):
        service.stop_shared()


onerror:
    from caprl import job_server, tracking_store
    from caprl.metrics import meteor_client

    for service in (job_server, meteor_client, tracking_store):
        service.stop_shared()
