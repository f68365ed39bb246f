# Stack-Cap Fig. 3: every stage's greedy caption with its per-word attention maps, for the
# first figures.attention_images images of the evaluation split, drawn from the Stack-Cap
# C2F run (the first runs.rl run whose model has arch stackcap and objective c2f).
ATTENTION_DIR = f"results/figures/{DS}/attention"
ATTENTION_RUNS = [
    run for run, spec in RUNS_RL.items()
    if spec["objective"] == "c2f" and config["models"][spec["model"]]["arch"] == "stackcap"
]
ATTENTION_PNGS = (
    expand(f"{ATTENTION_DIR}/attention_{{k}}.png", k=range(config["figures"]["attention_images"]))
    if ATTENTION_RUNS else []
)

if ATTENTION_PNGS:

    rule attention_figure:
        input:
            checkpoint=f"runs/{DS}/{ATTENTION_RUNS[0]}/best.pt",
            annotations=ANNOTATIONS,
            vocab=VOCAB,
            labels=LABELS,
            features=FEATURES,
            images=IMAGE_ROOT,
        output:
            ATTENTION_PNGS,
        params:
            n=config["figures"]["attention_images"],
            settings={"figures": config["figures"], "evaluate": config["evaluate"], "decode": config["decode"]},
        log:
            f"logs/{DS}/attention_figure.log",
        shell:
            "caprl attention-figure --params {PARAMS} --log {log} --checkpoint {input.checkpoint}"
            " --annotations {input.annotations} --features {input.features} --vocab {input.vocab}"
            " --labels {input.labels} --image-root {input.images} --out-dir {ATTENTION_DIR} --n-images {params.n}"
