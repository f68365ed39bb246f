"""Published numbers shown beside the main table's runs: a registry of result sets, typed in as data.

A dataset opts in with ``datasets.<name>.published: [set, ...]`` (names of :data:`PUBLISHED`); the
``main`` table then gives every run that matches a row of a listed set that row's numbers as the
paper column of its cells (``Cell.paper``: "ours (paper x, ±d)" in Markdown and LaTeX, the
``<column> (paper)`` column of the CSV), and its notes name the set's source and which row each run
was compared with. The paper-specific tables (``stackcap_table1``, ``sle_table2``, ...) carry their
papers' numbers themselves; this is for result lists that are not one paper's table, such as
self-critical.pytorch's MODEL_ZOO.md.

A row matches a run by what was trained, never by the run's name: the architecture of the run's
model (``models.<model>.arch``), its method, and the resolved options the row fixes (e.g.
``baseline: nsc``); a set matches only where its conditions hold for the run: its dataset, its
evaluation split, its backbone (``datasets.<name>.backbone``) and its decoding (the run's
``decode:``). A run that matches no row has no paper number; rows without a run are not shown.
The plan (:func:`check_dataset`) refuses an unknown set and a set of another dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from caprl.errors import CaprlError
from caprl.params import RunSpec
from caprl.registry import Registry

Numbers = dict[str, float]  # table column (the main table's short names: B@4, M, C, S, ...) -> value in %


@dataclass(frozen=True)
class PublishedRow:
    """One published result: its label as the source names it, what was trained, its numbers."""

    label: str
    arch: str  # a key of caprl.models.MODELS (models.<model>.arch)
    method: str  # a key of objectives: (the run's method)
    numbers: Numbers
    options: Mapping[str, Any] = field(default_factory=dict)  # resolved run options the row fixes
    config: str = ""  # where the source's settings for the row are (a file of its repository)

    def matches(self, view: RunSpec, arch: str) -> bool:
        return (arch == self.arch and view.method == self.method
                and all(view.options.get(key) == value for key, value in self.options.items()))


@dataclass(frozen=True)
class PublishedSet:
    """A list of published results and the conditions they were measured under."""

    source: str  # what the notes cite
    dataset: str  # the dataset (key of datasets:) the numbers are of
    split: str  # evaluate.split
    backbone: str  # datasets.<name>.backbone the rows' features correspond to
    decode: Mapping[str, Any]  # decode: values a run must have (e.g. beam search of width 5)
    rows: tuple[PublishedRow, ...]
    setting: str = ""  # how the numbers were obtained, for the notes (features, checkpoint choice, ...)

    def row_for(self, params: dict[str, Any], dataset: str, view: RunSpec) -> PublishedRow | None:
        """The row ``view`` (a run on ``dataset``) is compared with; None where none applies."""
        if (dataset != self.dataset or params["evaluate"]["split"] != self.split
                or params["datasets"][dataset]["backbone"] != self.backbone
                or any(view.decode.get(key) != value for key, value in self.decode.items())):
            return None
        arch = params["models"][view.model]["arch"]
        return next((row for row in self.rows if row.matches(view, arch)), None)


PUBLISHED: Registry[PublishedSet] = Registry("published result set")


def dataset_sets(params: dict[str, Any], dataset: str) -> list[tuple[str, PublishedSet]]:
    """The sets ``datasets.<dataset>.published`` names, in its order (CaprlError for an unknown name)."""
    names = params["datasets"][dataset].get("published", [])
    return [(name, PUBLISHED.get(name, where=f"datasets.{dataset}.published")) for name in names]


def check_dataset(params: dict[str, Any], dataset: str) -> None:
    """Every set the dataset lists is registered and holds numbers of that dataset."""
    for name, published in dataset_sets(params, dataset):
        if published.dataset != dataset:
            raise CaprlError(f"datasets.{dataset}.published: {name} holds numbers of dataset {published.dataset} "
                             f"({published.source}), not of {dataset}")


def match(params: dict[str, Any], dataset: str, view: RunSpec) -> tuple[str, PublishedSet, PublishedRow] | None:
    """The first listed set with a row for the run, and that row; None where none has one."""
    for name, published in dataset_sets(params, dataset):
        row = published.row_for(params, dataset, view)
        if row is not None:
            return name, published, row
    return None


def _row(columns: str, *values: float) -> Numbers:
    return dict(zip(columns.split(), values, strict=True))


_CS = "C S"

#: self-critical.pytorch's MODEL_ZOO.md (ruotianluo/self-critical.pytorch at 4c48a33, 2023-10-04), its
#: table "Trained with Bottomup feature": CIDEr and SPICE (fractions there, % here) on Karpathy's test
#: split, beam 5, the checkpoint of the highest validation CIDEr. Rows for architectures caprl does
#: not have (Att2in) and for schedules a run here cannot be told apart by (UpDown's "Schedule long",
#: ud_long_nsc.yml; the Transformer's warm-up + step decay, transformer_step.yml) are left out; the
#: Transformer's XE row is its Noam schedule's (transformer.yml), so it asks for lr_schedule noam.
SCP_MODEL_ZOO = PUBLISHED.register("scp_model_zoo")(PublishedSet(
    source="self-critical.pytorch MODEL_ZOO.md (ruotianluo/self-critical.pytorch 4c48a33), "
           "'Trained with Bottomup feature'",
    dataset="coco", split="test", backbone="bottomup", decode={"method": "beam", "beam_size": 5},
    setting="Karpathy test split, beam 5, the checkpoint of the highest validation CIDEr; bottom-up features of "
            "10-100 boxes per image (the adaptive trainval.zip), where caprl reads the fixed 36",
    rows=(
        PublishedRow("UpDown", "topdown", "xe", _row(_CS, 109.9, 19.99), config="configs/updown/updown.yml"),
        PublishedRow("UpDown+self_critical", "topdown", "scst", _row(_CS, 122.7, 21.45),
                     {"baseline": "greedy", "reward": "cider_d"}, "configs/updown/updown_sc.yml"),
        PublishedRow("UpDown+new_self_critical", "topdown", "scst", _row(_CS, 123.9, 21.54),
                     {"baseline": "nsc", "reward": "cider_d"}, "configs/updown/updown_nsc.yml"),
        PublishedRow("Transformer", "transformer", "xe", _row(_CS, 112.59, 20.63), {"lr_schedule": "noam"},
                     "configs/transformer/transformer.yml"),
        PublishedRow("Transformer+self_critical", "transformer", "scst", _row(_CS, 127.7, 22.49),
                     {"baseline": "greedy", "reward": "cider_d"}, "configs/transformer/transformer_scl.yml"),
        PublishedRow("Transformer+new_self_critical", "transformer", "scst", _row(_CS, 130.3, 22.89),
                     {"baseline": "nsc", "reward": "cider_d"}, "configs/transformer/transformer_nscl.yml"),
    ),
))
