"""The workflow: what Snakemake and DVC build from params.yaml (``plan``: every job, its files and
settings), the DVC writer and its syncer, the cost planner, tuning's report, and the MLflow sync."""
