"""Evaluation's decoding options (``decode:`` in params.yaml), read and checked for the decoder
that uses them.

Every option is off by default, and :data:`OFF` holds those values (params.yaml's): with them
every decoder decodes exactly as it did before the options existed. Each decoder reads some of
them (:data:`READS`): the constraints (:mod:`caprl.decoding.constraints`) every decoder but
lookahead; the length penalty and diverse groups (:mod:`caprl.decoding.selection`) the beam
decoders; top-k, top-p and the temperature (:mod:`caprl.decoding.sampling`) the sample decoder.
An option set for a decoder that does not read it, or a combination that means nothing, is a
CaprlError naming the key (:func:`options_problem`, which the plan and ``caprl evaluate`` ask
through :func:`run_options_problem` before any decoding, and :func:`read_options`, which every
decoder asks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from caprl.decoding.constraints import Constraints
from caprl.decoding.selection import LENGTH_PENALTIES
from caprl.errors import CaprlError

#: each option's value that turns it off (params.yaml's ``decode:`` holds these)
OFF: dict[str, Any] = {
    "length_penalty": "none", "length_alpha": 0.0, "groups": 1, "diversity_lambda": 0.0,
    "top_k": 0, "top_p": 1.0, "temperature": 1.0,
    "block_trigrams": False, "suppress_unk": False, "remove_bad_endings": False,
}
_CONSTRAINTS = ("block_trigrams", "suppress_unk", "remove_bad_endings")
_BEAM = _CONSTRAINTS + ("length_penalty", "length_alpha", "groups", "diversity_lambda")
#: the options each decoder of :data:`caprl.decoding.DECODERS` reads (any other: none)
READS: dict[str, tuple[str, ...]] = {
    "greedy": _CONSTRAINTS, "beam": _BEAM, "top_k_beams": _BEAM,
    "sample": _CONSTRAINTS + ("top_k", "top_p", "temperature"), "lookahead": (),
}


@dataclass(frozen=True)
class DecodeOptions:
    """What a decoder was asked for beyond its method, width and length (hashable: a captured
    decode's key holds it). The defaults are :data:`OFF`'s."""

    constraints: Constraints = Constraints()
    length_penalty: str = "none"
    length_alpha: float = 0.0
    groups: int = 1
    diversity_lambda: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def options_problem(decode: Mapping[str, Any], where: str = "decode") -> str | None:
    """What is wrong with the options of ``decode`` (a ``decode:`` section: ``method``,
    ``beam_size`` and any options; absent options are off), naming the key under ``where``;
    None when nothing is."""
    method = str(decode.get("method", ""))
    reads = READS.get(method, ())
    value = {key: decode.get(key, off) for key, off in OFF.items()}
    for key, off in OFF.items():
        if value[key] != off and key not in reads:
            readers = ", ".join(d for d, keys in READS.items() if key in keys)
            return (f"{where}.{key}: {value[key]!r}, but the {method} decoder ({where}.method) does not read it "
                    f"(set it back to {off!r}; decoders that read it: {readers})")
    if value["length_penalty"] not in LENGTH_PENALTIES:
        return (f"{where}.length_penalty: unknown length penalty {value['length_penalty']!r}; registered: "
                f"{', '.join(LENGTH_PENALTIES)}")
    if value["length_alpha"] < 0 or (value["length_alpha"] != 0 and value["length_penalty"] != "wu"):
        return (f"{where}.length_alpha: {value['length_alpha']!r}: only length_penalty wu has an alpha (>= 0), "
                f"and {where}.length_penalty is {value['length_penalty']}")
    groups, width = value["groups"], decode.get("beam_size", 1)
    if not _is_int(groups) or groups < 1 or width % groups:
        return f"{where}.groups: {groups!r} groups do not divide the {width} beams ({where}.beam_size) equally"
    if value["diversity_lambda"] < 0 or (groups > 1) != (value["diversity_lambda"] > 0):
        return (f"{where}.diversity_lambda: {value['diversity_lambda']!r} with {groups} group(s): diverse beam search "
                f"needs groups > 1 and diversity_lambda > 0 (groups with lambda 0 are copies of one beam search)")
    if not _is_int(value["top_k"]) or value["top_k"] < 0:
        return f"{where}.top_k: {value['top_k']!r}: an integer >= 0 (0: every word)"
    if not 0 < value["top_p"] <= 1:
        return f"{where}.top_p: {value['top_p']!r}: the nucleus' mass must be in (0, 1] (1: every word)"
    if not value["temperature"] > 0:
        return f"{where}.temperature: {value['temperature']!r}: must be > 0"
    return None


def run_options_problem(params: Mapping[str, Any], run: str, decode: Mapping[str, Any],
                        name_run: bool = True) -> str | None:
    """:func:`options_problem` of ``decode``, ``run``'s resolved ``decode:``, naming the key as the
    plan and the stages do: ``runs.<run>.decode.<key>`` where the run sets its own ``decode:``,
    else ``decode.<key>`` (then, with ``name_run``, prefixed ``run <run>: ``, as a stage of one
    run says it; the plan, which stops at the first run, does not)."""
    own = bool((params["runs"].get(run) or {}).get("decode"))  # the run's decode: over decode:
    problem = options_problem(decode, f"runs.{run}.decode" if own else "decode")
    return f"run {run}: {problem}" if problem is not None and name_run and not own else problem


def settings_for(decoder: str, decode: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``decode`` that ``decoder`` reads: a second decode under the same settings
    (e.g. the greedy captions of ``evaluate.greedy`` under ``decode:``'s constraints)."""
    return {key: decode[key] for key in READS.get(decoder, ()) if key in decode}


def read_options(settings: Mapping[str, Any], decoder: str, width: int = 1, where: str = "decode") -> DecodeOptions:
    """The options of ``settings`` (a decoder's keyword arguments: ``decode:`` keys, absent ones
    off, and ``words``, the vocabulary in index order, which ``remove_bad_endings`` needs) for
    ``decoder`` searching ``width`` beams; a CaprlError naming the key for what it cannot do."""
    decode = {**{k: settings[k] for k in OFF if k in settings}, "method": decoder, "beam_size": width}
    problem = options_problem(decode, where)
    if problem is not None:
        raise CaprlError(problem)
    value = {key: decode.get(key, off) for key, off in OFF.items()}
    words: Sequence[str] | None = settings.get("words")
    if value["remove_bad_endings"] and words is None:
        raise CaprlError(f"{where}.remove_bad_endings: the {decoder} decoder was not given the vocabulary's words "
                         "(words=), which name the bad endings")
    return DecodeOptions(
        constraints=Constraints.of(value["suppress_unk"], value["remove_bad_endings"], value["block_trigrams"], words),
        length_penalty=str(value["length_penalty"]), length_alpha=float(value["length_alpha"]),
        groups=int(value["groups"]), diversity_lambda=float(value["diversity_lambda"]), top_k=int(value["top_k"]),
        top_p=float(value["top_p"]), temperature=float(value["temperature"]))
