"""Evaluation: captions on a split, official metrics, one MLflow run per job."""
