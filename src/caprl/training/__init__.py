"""Training: one entry point for every model and objective."""
