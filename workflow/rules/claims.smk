# The papers' claims as targets of this DAG (params.yaml's claims:). Each seed of each enabled claims
# configuration is this workflow again as a module: the seed's params (params.yaml and any recipe,
# the config's demo: on the built-in sets, and the seed; caprl.claims.configs) written to its folder, every
# file under claims/<paper>/seed<k>/, its rules named claims_<paper>_seed<k>_<rule>. So each
# (paper, seed, run) is a job of the one DAG: SLURM runs every seed of every method at once, each
# job resumable, and a change of params or of the config re-runs what it invalidates. A real dataset's
# data are made once and hard-linked into every seed (rule shared_data). A paper's
# rule claims_<paper>_verdicts reads every seed's scores and writes claims/<paper>/verdicts.{json,md}
# (caprl claims); the targets claims_<paper> and all_claims publish them to results/claims/ with
# the summary of every paper there (caprl claims-summary): a target without outputs runs whenever
# it is asked for, so results/claims/ always shows what the DAG holds.
from caprl.claims import configs as claims_configs
from caprl.claims.collect import seed_inputs
from caprl.workflow.plan import build_plan

CLAIMS = config["claims"]
CLAIMS_CONFIGS = claims_configs.config_paths(Path(CLAIMS["configs"]), CLAIMS["papers"])
CLAIMS_PUBLISHED = "results/claims"  # what the last claims target published (tracked); the DAG's files: claims/
CLAIMS_VERDICTS = {}  # paper -> its verdicts json (its page beside it)


def inherit_set_resources(prefix):
    """The profile's `set-resources` (a GPU model, CPUs per GPU) name the main workflow's rules; a
    seed's rules are named `<prefix>_<rule>` when its module is read, and Snakemake looks them up by
    that name then: give them their main rule's first. (Job groups are the rules' own `group:`.)"""
    resources = workflow.resource_settings._parsed_overwrite_resources  # Snakemake 9's parsed --set-resources
    for rule in [rule.name for rule in workflow.rules if not rule.name.startswith("claims_")]:
        if rule in resources:
            resources[f"{prefix}_{rule}"] = resources[rule]


def claims_module(paper, path, seed, claims_config):
    """Register the seed's module and use its rules but the targets; the files its verdicts read."""
    workspace = claims_configs.WORKSPACE.format(paper=paper, seed=seed)
    params = claims_configs.seed_params(config, claims_config, seed)
    params_file = Path(claims_configs.PARAMS_FILE.format(paper=paper, seed=seed))
    claims_configs.write_seed_params(params_file, params)
    name = f"claims_{paper}_seed{seed}"
    seed_config = {**params, "claims_seed": {"workspace": workspace, "params_file": str(params_file)}}
    inherit_set_resources(name)
    workflow.module(name, snakefile=workflow.main_snakefile, config=seed_config, prefix=workspace)
    workflow.userule(rules=["*"], from_module=name, exclude_rules=["all_tables", "tuning", "caption_folder"],
                     name_modifier=f"{name}_*")(lambda: None)
    plan = build_plan(params)  # once per seed: every snakemake invocation (and SLURM job) parses every seed
    bound = claims_configs.bind(claims_config, params, plan)  # each claim's runs and tables on the dataset that builds them
    return [f"{workspace}/{path}" for path in seed_inputs(params, bound, plan)]


for paper, path in CLAIMS_CONFIGS.items():
    try:
        claims_config = claims_configs.load_config(path, CLAIMS["min_seeds"])
        inputs = [f for seed in claims_config["seeds"] for f in claims_module(paper, path, seed, claims_config)]
    except CaprlError as exc:
        raise WorkflowError(f"{path}: {exc}")
    CLAIMS_VERDICTS[paper] = f"claims/{paper}/verdicts.json"

    rule:  # the paper's verdicts over every seed of its config
        name:
            f"claims_{paper}_verdicts"
        input:
            config=str(path),
            scores=inputs,
        output:
            json=CLAIMS_VERDICTS[paper],
            md=CLAIMS_VERDICTS[paper].replace(".json", ".md"),
            tables=CLAIMS_VERDICTS[paper].replace(".json", "_tables.md"),  # its tables, mean and interval over the seeds
            aggregate=report(CLAIMS_VERDICTS[paper].replace(".json", "_aggregate.png"), caption="../report/aggregate.rst",
                             category="Claims", labels={"paper": paper, "figure": "rliable aggregate"}),
            forest=report(CLAIMS_VERDICTS[paper].replace(".json", ".png"), caption="../report/forest.rst",
                          category="Claims", labels={"paper": paper, "figure": "forest plot"}),
        params:
            target=f"claims_{paper}",
            min_seeds=CLAIMS["min_seeds"],
        log:
            f"logs/claims/{paper}.log",
        resources:
            **job_resources("claims"),
        shell:
            "caprl claims --log {log} --config {input.config} --out {output.json} --target {params.target}"
            " --min-seeds {params.min_seeds}"

    rule:  # target: the paper's verdicts, published in results/claims/ with the summary of every paper there
        name:
            f"claims_{paper}"
        input:
            CLAIMS_VERDICTS[paper],
        shell:
            "caprl claims-summary --publish {input} --out " + CLAIMS_PUBLISHED


# publishing copies a few files: on a cluster the targets run where Snakemake does
workflow.localrules("all_claims", *(f"claims_{paper}" for paper in CLAIMS_VERDICTS))


rule all_claims:  # target: every enabled paper's claims (claims.papers), published with their summary
    input:
        list(CLAIMS_VERDICTS.values()),
    shell:
        "caprl claims-summary --publish {input} --out " + CLAIMS_PUBLISHED
