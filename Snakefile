# caprl: raw data -> features -> vocabulary -> XE -> RL -> evaluation -> tables, for every
# enabled dataset of params.yaml. Every rule runs one `caprl <stage>` command; the jobs come
# from caprl.workflow.plan, which `caprl dvc-yaml` also uses to write dvc.yaml. The papers' claims
# (all_claims, claims_<paper>) run this workflow again per claims seed, as modules (claims.smk).
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


# A claims seed's module (workflow/rules/claims.smk) is this workflow with the seed's params and
# where its files go; the main workflow has no such key.
CLAIMS_SEED = config.pop("claims_seed", None)
validate(config, "workflow/schemas/params.schema.yaml")


# After `dvc pull`, `dvc checkout` or `dvc commit` (dvc.lock changed), the outputs DVC reports
# up to date get modification times in the DAG's order, so Snakemake re-runs none of them
# (caprl.workflow.dvc_sync; a no-op without a new dvc.lock).
if workflow.is_main_process and CLAIMS_SEED is None:
    from caprl.workflow.dvc_sync import sync_after_dvc

    sync_after_dvc()


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/caption.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/tuning.smk"


check_resources(workflow.rules)  # resources: in params.yaml names rules of this workflow
if CLAIMS_SEED is None:

    include: "workflow/rules/claims.smk"


rule all_tables:
    default_target: True  # also the target of `snakemake --report report.html`
    input:
        TABLE_FILES,
        FIGURE_FILES,


rule tuning:  # each tuned run's options chosen on the validation split (tuning: in params.yaml)
    input:
        TUNING_FILES,


# Two helpers shared by the jobs of a local run (caprl.cli.services): the job server (torch, MLflow
# and every stage imported once, each `caprl` job forked from it: ~5-8 s of CPU saved per job) and one
# METEOR JVM (~6 s per evaluation). The jobs find them through environment variables and do the
# work themselves without them. Not started on dry runs
# (Snakemake runs no hooks then) nor for cluster executors (jobs on other nodes cannot reach them);
# they exit by themselves when Snakemake does, even if neither hook below runs.
onstart:
    if workflow.local_exec:
        from caprl.cli import services

        for name, socket_path in services.start_all(".snakemake/log").items():
            logger.info(f"{name} for this run's jobs: {socket_path}")


onsuccess:
    from caprl.cli import services

    services.stop_all()


onerror:
    from caprl.cli import services

    services.stop_all()
