# caprl: raw data -> features -> vocabulary -> XE -> RL -> evaluation -> tables, for every
# enabled dataset of params.yaml. Every rule runs one `caprl <stage>` command; the jobs come
# from caprl.workflow_plan, which `caprl dvc-yaml` also uses to write dvc.yaml.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "params.yaml"


validate(config, "workflow/schemas/params.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/tables.smk"


rule all_tables:
    input:
        TABLE_FILES,
        FIGURE_FILES,
