"""What the plan checks of a training job's caption model (:mod:`caprl.models.compat`, which
``caprl train`` checks too, in the same words): its caption lengths within a Transformer's
positions, and an ``init.model`` run whose caption model has the job's architecture."""

from __future__ import annotations

from typing import Any

from caprl.errors import CaprlError
from caprl.models import compat


def check_job(params: dict[str, Any], job: Any, jobs: dict[tuple[str, str], Any]) -> None:
    """CaprlError for a job (:class:`caprl.workflow.plan.TrainJob`) whose model cannot hold its captions,
    or whose ``init.model`` run (a job of ``jobs`` on the same dataset) trains another architecture."""
    spec = job.spec
    problem = compat.length_problem(spec.source, spec.model, compat.model_config(params, spec.model),
                                    compat.caption_lengths(params, job.dataset))
    source = spec.init.get(compat.MODEL_ROLE)
    origin = jobs.get((job.dataset, source)) if source else None
    if problem is None and origin is not None:
        problem = compat.init_arch_problem(spec.source, compat.MODEL_ROLE, origin.spec.source,
                                           params["models"][origin.spec.model]["arch"],
                                           params["models"][spec.model]["arch"])
    if problem is not None:
        raise CaprlError(problem)
