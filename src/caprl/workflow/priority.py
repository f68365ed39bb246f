"""The train rule's scheduling priority (``train_priority`` in workflow/rules/common.smk).

Snakemake starts the ready job of highest priority first. On the 2 cores of the main command
two rules decide the wall time: a run that others start from must not wait (at d13de75 Top-Down's
XE start was picked last and trained alone for 111 s while its four RL runs waited), and a long run
must not be the last one started (with the runs nothing starts from all at priority 0, PG-SPIDEr's
CIDEr-D run was started last in every timed run: 23, 40 and 132 s alone at the end). So the
priority of a training job is :meth:`Plan.waiting_on` (how many jobs start from it) plus its
estimated hours over the longest job's (``caprl plan``'s CPU estimate, :mod:`caprl.workflow.costs`),
a fraction below 1: the more jobs wait on a run the earlier, and among equals the longest first.
The estimate only orders jobs; where it is off (small models on the CPU) the order is still close,
and where there is none (a dataset of the user's own, not prepared yet: no size to cost it by) the
jobs are ordered by ``waiting_on`` alone: the DAG must build before its first job prepares the data.
"""

from __future__ import annotations

from caprl.errors import CaprlError
from caprl.workflow import costs
from caprl.workflow.plan import Plan


def train_priorities(plan: Plan, device: str = "cpu") -> dict[tuple[str, str], float]:
    """(dataset, run) -> the train rule's priority of every training job of ``plan``."""
    try:
        hours = {(row.dataset, row.run): row.hours or 0.0
                 for row in costs.estimate(plan.params, device).rows if row.rule == "train"}
    except CaprlError:  # no size known for a dataset yet
        hours = {}
    longest = max(hours.values(), default=0.0) or 1.0
    return {(ds, run): round(plan.waiting_on(ds, run) + 0.999 * hours.get((ds, run), 0.0) / longest, 3)
            for ds, run in plan.jobs}
