"""Learning-rate schedules, by name: an objective's ``lr_schedule`` option.

A schedule gives the factor on every optimiser group's rate (``param_groups``' ``lr``, ``baseline_lr``,
...) before optimiser step ``step`` (0-based, counted over the whole run) of (0-based) ``epoch``: a
pure function of the position, so a resumed run gets the rates an uninterrupted one would. The
trainer sets it before every step (:meth:`caprl.training.loop.Trainer.lrs`).

* ``step``: ``lr_decay_rate ** (epoch // lr_decay_every)`` (1 when ``lr_decay_every`` is 0),
  self-critical.pytorch's ``learning_rate_decay_every`` / ``_rate``.
* ``noam``: the rate of Vaswani et al. 2017 (sec. 5.3, eq. 3) as self-critical.pytorch's
  ``NoamOpt`` (captioning/utils/misc.py; ``--noamopt``, ``noamopt_warmup``, ``noamopt_factor``) sets it:
  ``factor * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` at its s-th update (s = step + 1),
  ``d_model`` the model's (only a model with one: the transformer). The rate replaces ``lr`` (SCP's
  Adam is built with lr 0 and NoamOpt overwrites it): the factor is that rate / ``lr``, so the
  model's group gets the Noam rate exactly and an objective's own groups keep their ratio to ``lr``.
  SCP's transformer recipe (configs/transformer/transformer.yml: ``noamopt: true``,
  ``noamopt_warmup: 20000``; factor: opts.py's default, 1) uses it for XE; its SCST recipe
  (transformer_scl.yml) turns it off.
"""

from __future__ import annotations

from typing import Callable, Protocol

from caprl.errors import CaprlError
from caprl.registry import Registry


class Scheduled(Protocol):
    """The options a schedule reads (:class:`caprl.objectives.base.Options`)."""

    lr: float
    lr_decay_every: int
    lr_decay_rate: float
    noam_warmup: int
    noam_factor: float


#: (options, epoch, step, the model's d_model or None) -> the factor on every group's rate
Schedule = Callable[[Scheduled, int, int, "int | None"], float]
LR_SCHEDULES: Registry[Schedule] = Registry("learning-rate schedule")


@LR_SCHEDULES.register("step")
def step_decay(options: Scheduled, epoch: int, step: int, d_model: int | None) -> float:
    if options.lr_decay_every == 0:
        return 1.0
    return options.lr_decay_rate ** (epoch // options.lr_decay_every)


def noam_rate(update: int, d_model: int, warmup: int, factor: float) -> float:
    """SCP's ``NoamOpt.rate`` at its ``update``-th optimiser step (1-based)."""
    return factor * d_model ** -0.5 * min(update ** -0.5, update * warmup ** -1.5)


@LR_SCHEDULES.register("noam")
def noam(options: Scheduled, epoch: int, step: int, d_model: int | None) -> float:
    if not d_model:
        raise CaprlError("lr_schedule noam needs a model with a d_model (arch transformer)")
    return noam_rate(step + 1, d_model, options.noam_warmup, options.noam_factor) / options.lr
