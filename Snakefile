# caprl: raw data -> features -> vocabulary -> XE -> RL -> evaluation -> tables.
# Every rule runs one `caprl <stage>` command; dvc.yaml runs the same commands.
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
