"""caprl: reinforcement-learning captioning, from raw data to the papers' tables."""

__version__ = "0.1.0"
