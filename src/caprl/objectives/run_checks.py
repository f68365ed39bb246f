"""What a run's definition may ask of its method, decided in one place.

The plan (:func:`caprl.workflow.plan.build_plan`, so ``snakemake -n`` and ``caprl dvc-yaml``)
and the stages (``caprl train``, ``caprl evaluate``) call these, so that a definition the plan
refuses is refused by the stage in the same words, and the other way round:

* :func:`init_role_problem`: an ``init`` role must be a module the method has (``model``, or
  one of its objective's ``holds``);
* :func:`init_model_problem`: ``init.model`` must come from a run that trains a caption model;
* :func:`decoder_problem`: a decoder that needs a module (lookahead: a value network) only for
  runs whose method trains one;
* :func:`options_problem`: a run's resolved options are its method's (names, types, choices:
  the objective's ``Options`` dataclass, the one declaration of them);
* :func:`name_problem`: a name looked up in a registry (backbone, decoder) is registered there.

Each returns None where all is well, else the message (naming the params key and the fix).
"""

from __future__ import annotations

from typing import Any

from caprl.errors import CaprlError

MODEL = "model"  # the caption model's role (caprl.models.checkpoint.MODEL)
#: decoders that need a module of the run's method beside the caption model: decoder -> (role, what)
DECODER_NEEDS: dict[str, tuple[str, str]] = {"lookahead": ("value", "a value network")}


def _objective(method: str, where: str) -> Any:
    from caprl.objectives import OBJECTIVES

    return OBJECTIVES.get(method, where=where)


def method_roles(method: str, where: str = "method") -> tuple[str, ...]:
    """The module roles a run of ``method`` has: the caption model and its objective's own."""
    return (MODEL, *_objective(method, where).holds)


def init_role_problem(run: str, method: str, role: str) -> str | None:
    """``runs.<run>.init.<role>`` names a module ``method`` does not have."""
    roles = method_roles(method, f"runs.{run}.method")
    if role in roles:
        return None
    return (f"runs.{run}.init.{role}: method {method} has no module '{role}' (its runs train "
            f"{', '.join(roles)}); drop init.{role}")


def init_model_problem(run: str, source: str, source_method: str, source_init: dict[str, str]) -> str | None:
    """``runs.<run>.init.model`` names run ``source``, whose method trains no caption model: its
    checkpoint's caption model is untrained, or only the one it started from."""
    if _objective(source_method, f"runs.{source}.method").captioner:
        return None
    before = source_init.get(MODEL)
    if before:
        what, fix = "the one it started from", f"name run {before} (runs.{source}.init.model)"
    else:
        what, fix = "untrained", "name a run that trains one (e.g. an xe run)"
    return (f"runs.{run}.init.model: run {source} (method {source_method}) trains no caption model, so its "
            f"checkpoint's caption model is {what}; {fix}")


def decoder_problem(run: str, method: str, decoder: str, key: str) -> str | None:
    """``key`` (the run's decode.method) asks for ``decoder``, which needs a module ``method`` lacks."""
    need = DECODER_NEEDS.get(decoder)
    if need is None or need[0] in method_roles(method, f"runs.{run}.method"):
        return None
    holders = sorted(name for name in _all_methods()
                     if need[0] in method_roles(name) and _objective(name, "method").captioner)
    return (f"{key}: {decoder} decoding needs {need[1]}, which method {method} of run {run} does not train "
            f"(only {', '.join(holders)} runs have one): decode it with greedy or beam")


def options_problem(run: str, method: str, options: dict[str, Any]) -> str | None:
    """``runs.<run>``'s options (``objectives.<method>`` with the run's on top) are not what
    ``method``'s Options declares: an unknown or missing option, a wrong type, a name not among
    its choices. Checked at plan time so that ``snakemake -n`` refuses what ``caprl train`` would."""
    try:
        _objective(method, f"runs.{run}.method").Options.from_dict(dict(options), where=f"runs.{run}.options")
    except CaprlError as exc:
        return str(exc)
    return None


def name_problem(registry: Any, name: str, key: str) -> str | None:
    """``key`` names ``name``, which ``registry`` does not hold (the registries, not the schema,
    list what a name may be: a new backbone or decoder is one registration)."""
    if name in registry:
        return None
    return f"{key}: unknown {registry.kind} '{name}'; registered: {', '.join(registry)}"


def decode_key(params: dict[str, Any], run: str) -> str:
    """The params key that sets ``run``'s evaluation decoder: its own ``decode.method`` or the global one."""
    own = "method" in (params["runs"].get(run) or {}).get("decode", {})
    return f"runs.{run}.decode.method" if own else "decode.method"


def _all_methods() -> list[str]:
    from caprl.objectives import OBJECTIVES

    return list(OBJECTIVES)


def refuse(problem: str | None) -> None:
    """Raise the problem as a CaprlError; nothing where there is none."""
    if problem is not None:
        raise CaprlError(problem)
