"""Training methods by name: importing this package registers every objective."""

from caprl.objectives import (actor_critic, c2f, dico, discriminative, grpo, listener, mixer, pg_spider,  # noqa: F401
                              ppo_kl, scst, sle, straight_through, value, xe)  # (registers them)
from caprl.objectives.base import (OBJECTIVES, Batch, Objective, ObjectiveEnv, Options, build_objective,
                                   register_objective)

__all__ = ["OBJECTIVES", "Batch", "Objective", "ObjectiveEnv", "Options", "build_objective", "register_objective"]
