"""Training methods by name: importing this package registers every objective."""

from caprl.objectives import c2f, discriminative, listener, pg_spider, scst, sle, xe  # noqa: F401  (registers them)
from caprl.objectives.base import (OBJECTIVES, Batch, Objective, ObjectiveEnv, Options, build_objective,
                                   register_objective)

__all__ = ["OBJECTIVES", "Batch", "Objective", "ObjectiveEnv", "Options", "build_objective", "register_objective"]
