# Stack-Cap Fig. 3, per dataset: every stage's greedy caption with its per-word attention maps,
# for the first figures.attention_images images of the evaluation split, drawn from the first
# run of the dataset with method c2f and a model of arch stackcap (none: no figure).
ATTENTION_DATASETS = [ds for ds in DATASETS if PLAN.attention_job(ds)]

if ATTENTION_DATASETS:

    rule attention_figure:
        input:
            checkpoint=attention_checkpoint,
            annotations=wp.ANNOTATIONS,
            vocab=wp.VOCAB,
            labels=wp.LABELS,
            features=features_file,
            images=media_root,
        output:
            [
                report(wp.ATTENTION_PNG.format(dataset="{dataset}", k=k), caption="../report/attention.rst",
                       category="{dataset}", subcategory=PAPERS["stackcap"],
                       labels={"result": f"Fig. 3: attention maps, test image {k}"})
                for k in range(config["figures"]["attention_images"])
            ],
        wildcard_constraints:
            dataset=one_of(ATTENTION_DATASETS),
        params:
            params_file=PARAMS,
            n=config["figures"]["attention_images"],
            out_dir=outputs_folder,
            settings={"figures": config["figures"], "evaluate": config["evaluate"], "decode": config["decode"]},
        log:
            "logs/{dataset}/attention_figure.log",
        resources:
            **job_resources("attention_figure"),
        shell:
            "caprl attention-figure --params {params.params_file} --log {log} --dataset {wildcards.dataset}"
            " --checkpoint {input.checkpoint} --annotations {input.annotations} --features {input.features}"
            " --vocab {input.vocab} --labels {input.labels} --image-root {input.images} --out-dir {params.out_dir}"
            " --n-images {params.n}"


# Paper 004's Fig. 3 (recall@10 against each language metric, one curve per method over its
# lam points) and Fig. 4 (recall@10 at a fixed CIDEr-D against rho), per dataset with runs
# that hold a listener.
PSST_DATASETS = [ds for ds in DATASETS if PLAN.psst_pngs(ds)]
PSST_LABELS = {"psst_fig3": "Fig. 3: R@10 vs language metrics", "psst_fig4": "Fig. 4: R@10 at a fixed CIDEr-D vs rho"}

if PSST_DATASETS:

    rule psst_figures:
        input:
            table_scores,
        output:
            [
                report(wp.PSST_PNG.format(dataset="{dataset}", figure=figure), caption="../report/psst_figure.rst",
                       category="{dataset}", subcategory=PAPERS["psst"], labels={"result": PSST_LABELS[figure]})
                for figure in wp.PSST_FIGURES
            ],
        wildcard_constraints:
            dataset=one_of(PSST_DATASETS),
        params:
            params_file=PARAMS,
            results=here(wp.RESULTS),
            out_dir=outputs_folder,
            settings=table_settings,
        log:
            "logs/{dataset}/psst_figures.log",
        resources:
            **job_resources("psst_figures"),
        shell:
            "caprl psst-figures --params {params.params_file} --log {log} --dataset {wildcards.dataset}"
            " --results-dir {params.results} --out-dir {params.out_dir}"


# Learning curves, per dataset: one job (one process) reads every trained run's history.json
# and writes each run's train loss and validation CIDEr-D per epoch (PNG + CSV) and the
# validation CIDEr-D of every run in one PNG. Its outputs depend on the dataset's runs, so
# there is one rule per dataset, curves_<dataset> (Snakemake's procedural rule definition).
for curves_dataset in [ds for ds in DATASETS if PLAN.curve_files(ds)]:

    rule:
        name:
            f"curves_{curves_dataset}"
        input:
            [job.history for job in PLAN.trained(curves_dataset)],
        output:
            runs=curve_outputs(curves_dataset),
            overview=report(wp.CURVES_OVERVIEW.format(dataset=curves_dataset), caption="../report/curves_overview.rst",
                            category=curves_dataset, subcategory=PAPERS["curves"],
                            labels={"result": "(all runs) validation CIDEr-D"}),
        params:
            params_file=PARAMS,
            dataset=curves_dataset,
            out_dir=curves_folder,
        log:
            f"logs/{curves_dataset}/curves.log",
        resources:
            **job_resources("curves"),
        shell:
            "caprl curves --params {params.params_file} --log {log} --dataset {params.dataset}"
            " --out-dir {params.out_dir} --overview {output.overview} --history {input}"
