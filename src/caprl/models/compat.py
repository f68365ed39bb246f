"""Whether a run's caption lengths and starting weights fit its caption model, decided in one place.

The plan (:mod:`caprl.workflow.model_checks`, so ``caprl plan``, ``snakemake -n`` and ``caprl
dvc-yaml``) and ``caprl train`` call these, so that a run the plan refuses is refused by the stage
in the same words, before it writes anything:

* :func:`length_problem`: a model with a fixed number of positions (the Transformer's decode cache,
  ``models.<model>.max_positions``) holds every caption the run decodes (``decode.max_length``:
  training's samples and greedy baselines, the objective's ``max_length``, validation's and
  evaluation's decodes) or learns (the vocabulary's ``max_length``: XE's gold captions), each with
  its end token: ``max_length + 1`` positions;
* :func:`init_arch_problem`: ``init.model`` names a run whose caption model is of the run's own
  architecture (a Transformer's weights do not start a Top-Down model).

Each returns None where all is well, else the message (naming the params keys and the fix).
"""

from __future__ import annotations

from typing import Any

from caprl.models.base import MODELS

#: the config field that bounds a caption's positions, where an architecture has one
POSITIONS = "max_positions"
MODEL_ROLE = "model"  # the caption model's init role (caprl.models.checkpoint.MODEL)


def model_config(params: dict[str, Any], model: str) -> Any:
    """The resolved config of ``models.<model>`` (its arch's dataclass: the values a run builds)."""
    entry = dict(params["models"][model])
    arch = entry.pop("arch")
    return MODELS.get(arch, where=f"models.{model}.arch").config_class.from_dict(entry, f"models.{model}")


def caption_lengths(params: dict[str, Any], dataset: str, decode_length: int | None = None,
                    vocab_length: int | None = None) -> dict[str, int]:
    """``{params key: value}`` of the caption lengths a run on ``dataset`` meets: ``decode.max_length``
    and the vocabulary's ``max_length`` (``datasets.<dataset>.vocab.max_length`` where it has its own);
    ``decode_length`` / ``vocab_length``: the values a training job uses instead of params' (its
    objective's ``max_length``, its vocabulary file's)."""
    own = "max_length" in (params["datasets"][dataset].get("vocab") or {})
    vocab_key = f"datasets.{dataset}.vocab.max_length" if own else "vocab.max_length"
    if vocab_length is None:
        vocab_length = (params["datasets"][dataset]["vocab"] if own else params["vocab"])["max_length"]
    if decode_length is None:
        decode_length = params["decode"]["max_length"]
    return {"decode.max_length": int(decode_length), vocab_key: int(vocab_length)}


def length_problem(run: str, model: str, config: Any, lengths: dict[str, int]) -> str | None:
    """A caption length of ``lengths`` (params key -> tokens) that, with its end token, does not fit
    run ``run``'s model ``models.<model>`` (``config``); None for a model without fixed positions."""
    positions = getattr(config, POSITIONS, None)
    if positions is None:
        return None
    for key, length in lengths.items():
        if length >= positions:
            return (f"runs.{run}: {key} is {length}, which reaches models.{model}.{POSITIONS} ({positions}): the "
                    f"Transformer's decode cache holds {positions} positions, and a caption of {length} tokens with "
                    f"its end token needs {length + 1}; set models.{model}.{POSITIONS} to at least {length + 1}, "
                    f"or {key} to at most {positions - 1}")
    return None


def init_arch_problem(run: str, role: str, source: str, source_arch: str, arch: str) -> str | None:
    """``runs.<run>.init.<role>`` (the caption model) names run ``source``, whose caption model is a
    ``source_arch``, where run ``run`` trains a ``arch``."""
    if source_arch == arch:
        return None
    return (f"runs.{run}.init.{role}: run {source} trains a {source_arch} caption model and run {run} a {arch}: "
            f"the weights of one architecture cannot start another; start run {run} from a run of a {arch} "
            f"model (e.g. its xe run), or drop init.{role} to train it from scratch")
