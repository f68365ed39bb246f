"""What the tables read of params.yaml besides the runs, resolved into typed settings.

A table builder (``(params, dataset, scores) -> Table``, :data:`caprl.tables.build.TABLES`) takes
one :class:`TableSettings` from the params (:meth:`TableSettings.from_params`): the evaluated split
and decoding of the titles, the "C greedy" column, paper 002's diversity sets, paper 003's
lookahead row and the models' order (the tables' row order). The params themselves still go to
what resolves a run or a model (:mod:`caprl.tables.runs`, :func:`caprl.params.run_spec`, a model's
architecture) and to the sections one table reads for itself (the published sets' matching,
``discriminative``, ``evaluate.clip_score``). Every field is a params.yaml key the schema requires;
no default lives here, except that an absent ``evaluate.lookahead`` section means no lookahead row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from caprl.evaluation.settings import Diversity, Lookahead


def decoding_label(decode: Mapping[str, Any]) -> str:
    """How a decoding reads in a title or row: "beam 5", else its method ("greedy")."""
    return f"beam {decode.get('beam_size')}" if decode.get("method") == "beam" else str(decode.get("method"))


@dataclass(frozen=True)
class TableSettings:
    split: str  # evaluate.split: the split every score file was made on
    decode: Mapping[str, Any]  # decode: the evaluated decoding, as params.yaml has it (a run may override it)
    greedy: bool  # evaluate.greedy: the main table's "C greedy" column
    diversity: Diversity  # evaluate.diversity: paper 002's Table 4 caption sets
    lookahead: Lookahead | None  # evaluate.lookahead: paper 003's lookahead row (None: the section is absent)
    models: tuple[str, ...]  # models: in params order, the tables' row order

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "TableSettings":
        ev = params["evaluate"]
        return cls(split=str(ev["split"]), decode=dict(params["decode"]), greedy=bool(ev["greedy"]),
                   diversity=Diversity.of(ev["diversity"]), lookahead=Lookahead.of(ev.get("lookahead")),
                   models=tuple(params["models"]))

    def model_rank(self, model: str) -> int:
        """A model's place in params order (models not listed last): sort rows by it."""
        return self.models.index(model) if model in self.models else len(self.models)

    def decoding(self, decode: Mapping[str, Any] | None = None) -> str:
        """How a decoding reads in a title or row ("beam 5", "greedy"): ``decode``, else the evaluated one."""
        return decoding_label(decode if decode is not None else self.decode)
