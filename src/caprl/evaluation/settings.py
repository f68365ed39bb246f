"""What an evaluation job reads of params.yaml, resolved once into typed settings.

``caprl evaluate`` and ``caprl caption`` build one :class:`EvalSettings` from the params
(``evaluate:``, ``decode.max_length``, ``seed``, ``train.num_threads`` / ``cuda_graphs``,
``spice.corenlp_dir``) and hand it to every function that decodes or scores. The params dict
itself still goes to what resolves a run (its decoding, :func:`caprl.evaluation.run.run_decode`;
the key that sets its decoder), to CLIP-S (``evaluate.clip_score`` per dataset) and to the
record of the job (:func:`caprl.evaluation.report.score_and_record`, which logs the sections as
params.yaml has them). Every field is a params.yaml key
(the schema requires it, ``workflow/schemas/params.schema.yaml``): no default lives here,
except that an absent ``evaluate.lookahead`` section means no lookahead row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Diversity:
    """``evaluate.diversity``: paper 002's Table 4 caption sets (rs samples, bs beams)."""

    methods: tuple[str, ...]  # runs of these methods get the diversity evaluation
    samples: int  # rs: random samples per image
    beams: int  # bs: the top beams of one beam search of this width
    examples: int  # images whose sets the report shows

    @classmethod
    def of(cls, section: Mapping[str, Any]) -> "Diversity":
        return cls(methods=tuple(section["methods"]), samples=int(section["samples"]), beams=int(section["beams"]),
                   examples=int(section["examples"]))

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "beams": self.beams, "examples": self.examples, "methods": list(self.methods)}


@dataclass(frozen=True)
class Lookahead:
    """``evaluate.lookahead``: paper 003's lookahead inference (Ren et al. sec. 3.4)."""

    lam: float  # weight of the policy's log-probability; 1 - lam on the value
    candidates: int  # the most likely words per beam whose value is computed

    @classmethod
    def of(cls, section: Mapping[str, Any] | None) -> "Lookahead | None":
        """The section's settings; None where it is absent (no lookahead row)."""
        return cls(float(section["lam"]), int(section["candidates"])) if section else None


@dataclass(frozen=True)
class EvalSettings:
    split: str
    batch_size: int
    metrics: tuple[str, ...]
    n_examples: int
    greedy: bool  # also score the greedy captions (the main table's "C greedy")
    diversity: Diversity
    lookahead: Lookahead | None  # None: the section is absent, no lookahead row
    seed: int  # sampling decoders' generators
    max_length: int  # decode.max_length: the greedy and diversity decodes' length
    num_threads: int  # train.num_threads: torch's CPU threads
    cuda_graphs: bool  # train.cuda_graphs: greedy and beam decodes replayed as CUDA graphs
    corenlp_dir: str | None  # spice.corenlp_dir: SPICE's CoreNLP jars

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "EvalSettings":
        ev = params["evaluate"]
        return cls(split=str(ev["split"]), batch_size=int(ev["batch_size"]), metrics=tuple(ev["metrics"]),
                   n_examples=int(ev["n_examples"]), greedy=bool(ev["greedy"]),
                   diversity=Diversity.of(ev["diversity"]), lookahead=Lookahead.of(ev.get("lookahead")),
                   seed=int(params["seed"]), max_length=int(params["decode"]["max_length"]),
                   num_threads=max(1, int(params["train"]["num_threads"])),
                   cuda_graphs=bool(params["train"]["cuda_graphs"]),
                   corenlp_dir=params["spice"]["corenlp_dir"])
