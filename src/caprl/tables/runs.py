"""Which runs a table shows: the captioner runs of params.yaml ``runs:`` that train on a dataset.

Runs are one flat mapping ``run -> {method, model, options, init, datasets}``
(:func:`caprl.params.run_spec`). A run has scores (and so rows) only if its method's
objective is a captioner (``caprl.objectives.OBJECTIVES[method].captioner``) and it trains
on the dataset (its ``datasets`` list; default: every enabled dataset). A run whose method
pre-trains a listener alone has no scores, only its listener's gold-caption retrieval results.
"""

from __future__ import annotations

from typing import Any

from caprl.params import RunSpec, run_spec
from caprl.run_points import compared_runs


def is_captioner(spec: RunSpec) -> bool:
    """True if a run of this method yields a caption model (evaluated, so in the tables)."""
    from caprl.objectives import OBJECTIVES

    return bool(OBJECTIVES.get(spec.method, where=f"runs.{spec.name}.method").captioner)


def has_gold_retrieval(spec: RunSpec) -> bool:
    """True if a run of this method pre-trains a listener alone, scored on the gold captions
    (``caprl.objectives.OBJECTIVES[method].gold_retrieval``; ``caprl retrieval --gold``)."""
    from caprl.objectives import OBJECTIVES

    return bool(OBJECTIVES.get(spec.method, where=f"runs.{spec.name}.method").gold_retrieval)


def gold_retrieval_runs(params: dict[str, Any], dataset: str) -> list[RunSpec]:
    """The listener pre-training runs that train on ``dataset``, in params order."""
    specs = [run_spec(params, run) for run in compared_runs(params)]
    return [s for s in specs if dataset in s.datasets and has_gold_retrieval(s)]


def dataset_runs(params: dict[str, Any], dataset: str) -> list[RunSpec]:
    """The captioner runs that train on ``dataset``, in params order."""
    specs = [run_spec(params, run) for run in compared_runs(params)]
    return [s for s in specs if dataset in s.datasets and is_captioner(s)]


#: methods whose paper rows are on their own reward only (every paper's SCST row is "SCST, CIDEr")
OWN_REWARD_ROWS = {"scst"}


def select(params: dict[str, Any], dataset: str, *, model: str | None = None,
           method: str | None = None) -> list[RunSpec]:
    """The dataset's captioner runs with this model (a key of ``models:``) / method (params order).
    With ``method``: its paper's rows only, i.e. runs with the method's own baseline and reward
    (``objectives.<method>``; the reward only for :data:`OWN_REWARD_ROWS`): an NSC run or an
    embedding-rewarded SCST run is in the main table, not in a paper's SCST row."""
    own = params["objectives"].get(method, {}) if method is not None else {}

    def paper_row(s: RunSpec) -> bool:
        keys = ["baseline"] + (["reward"] if method in OWN_REWARD_ROWS else [])
        return all(s.options.get(k) == own.get(k) for k in keys if k in own)

    return [s for s in dataset_runs(params, dataset)
            if (model is None or s.model == model) and (method is None or (s.method == method and paper_row(s)))]
