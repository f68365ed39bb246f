"""Official caption metrics (pycocoevalcap), the `caprl score` stage, and diversity metrics."""
