"""Naturalness-vs-discriminability curves of paper 004's runs, and operating points on them.

Every discriminative method is trained at several λ (``lam``, the weight of the
discriminative loss); each run is one point (its language metrics from ``scores.json``, its
listener's recall from ``retrieval.json``). A method's *curve* is its runs on a dataset
ordered by **ascending λ** (from the most natural run to the most discriminative one), as
(x, y) pairs of two of those numbers. The paper compares methods at an *operating point*:
one value of x (R@5 = 80% in Table 1, CIDEr-D = 1.2 in Table 2, ...) where every curve is
read by linear interpolation (:func:`interpolate`). Runs are recognised by their method,
options and init run (:func:`family_points`), never by their names.

The operating points are ``discriminative.operating_points.<dataset>.<key>`` in params.yaml
(keys ``recall5``, ``cider``, ``ablation_cider``, ``rho_cider``; values on the metric's own
scale: R@5 0.80, CIDEr-D 1.2), a number or ``auto``: the highest x that every compared curve
reaches (:func:`overlap_value`). A dataset absent from ``operating_points`` is all ``auto``.
PSST rows of the tables use the runs with ``rho == discriminative.table_rho``.

``auto`` is chosen on the **validation** split: every score file ``caprl evaluate`` writes carries
the val metrics of the epoch its evaluated checkpoint holds (``report["validation"]``, read from
the checkpoint itself, :mod:`caprl.evaluation.validation`). x0 is the overlap value of the
*validation* curves (:data:`VAL`), and each method's test numbers are read where its
validation curve reaches x0 (:func:`read_curve`); a method whose validation curve does not
reach x0 has no value there. Score reports without validation numbers (made by hand, or by a
caprl before evaluate recorded them) fall back to the test curves (:data:`TEST`), and the
tables say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from caprl.errors import CaprlError
from caprl.evaluation import validation
from caprl.params import RunSpec, run_spec
from caprl.run_points import compared_runs
from caprl.tables.settings import decoding_label

Curve = list[tuple[float, float]]

#: method (registry key) -> the paper's name of its rows, in the paper's row order.
METHOD_LABELS: dict[str, str] = {
    "luo2018": "Luo et al. 2018",
    "reinforce_joint": "REINFORCE",
    "st_gumbel": "ST Gumbel Softmax",
    "st_multinomial": "ST Multinomial",
    "psst_gumbel": "PSST Gumbel Softmax",
    "psst_multinomial": "PSST Multinomial",
}
FROZEN = "frozen_speaker"  # the ablation: speaker frozen, listener trained (one point per run)
#: the method of a frozen-speaker run's init model -> the paper's name of its row (Table 3).
FROZEN_LABELS: dict[str, str] = {"luo2018": "Frozen Speaker (Luo)", "xe": "Frozen Speaker (MLE)"}
PSST_METHODS: dict[str, str] = {"psst_gumbel": "st_gumbel", "psst_multinomial": "st_multinomial"}  # -> its ρ = 0
FAMILY = [*METHOD_LABELS, FROZEN]
RECALLS = ["R@1", "R@5", "R@10"]
LANGUAGE = ["CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L", "SPICE"]
OPERATING_KEYS = ("recall5", "cider", "ablation_cider", "rho_cider")
AUTO = "auto"
TEST, VAL = "test", "validation"  # which numbers of a point a curve is made of (Point.values / Point.val)


# ---------------------------------------------------------------- curves


def interpolate(curve: Curve, x0: float) -> float | None:
    """y at ``x0`` on ``curve`` (points in λ order): linear on the first segment, in curve
    order, whose x-range holds ``x0`` (an exact hit on a segment's end gives that point's y).
    None where ``x0`` is outside every segment; a one-point curve only answers its own x."""
    if len(curve) == 1:
        x, y = curve[0]
        return y if x == x0 else None
    for (xa, ya), (xb, yb) in zip(curve, curve[1:]):
        if not min(xa, xb) <= x0 <= max(xa, xb):
            continue
        if x0 == xa:
            return ya
        if x0 == xb:
            return yb
        return ya + (yb - ya) * (x0 - xa) / (xb - xa)
    return None


def overlap_value(curves: Iterable[Curve]) -> float | None:
    """The highest x inside the most curves' x-ranges: where every curve's range overlaps, the
    least of their largest x (the paper's Fig. 4: "the maximal value that overlaps all
    variants"); where they do not, the highest x that the largest number of curves reach (the
    other curves' cells then show —). None without a curve. Empty curves are left out."""
    ranges = [(min(x for x, _ in c), max(x for x, _ in c)) for c in curves if c]
    if not ranges:
        return None
    candidates = sorted({x for r in ranges for x in r})
    reached = [(sum(lo <= x <= hi for lo, hi in ranges), x) for x in candidates]
    return max(reached)[1]


def x_range(curve: Curve) -> tuple[float, float] | None:
    return (min(x for x, _ in curve), max(x for x, _ in curve)) if curve else None


# ---------------------------------------------------------------- runs as points


@dataclass(frozen=True)
class Point:
    """One run of the family: its λ, ρ, init run's method and numbers (language metrics on
    their own scale, R@K as fractions, mean rank). ``values`` (test: scores and retrieval) is
    empty without results; ``val`` holds the validation numbers of the epoch its checkpoint
    holds (val CIDEr-D, val R@K), empty where none were given."""

    spec: RunSpec
    lam: float | None
    rho: float | None
    init_method: str | None  # frozen_speaker: the method of its init.model run
    init_run: str | None
    values: dict[str, float]
    val: dict[str, float] = field(default_factory=dict)

    def numbers(self, split: str = TEST) -> dict[str, float]:
        """``values`` (TEST) or ``val`` (VAL)."""
        if split not in (TEST, VAL):
            raise ValueError(f"split {split!r}: expected {TEST!r} or {VAL!r}")
        return self.values if split == TEST else self.val

    @property
    def method(self) -> str:
        return self.spec.method

    @property
    def complete(self) -> bool:
        """Scored and ranked: it has a language metric and a recall."""
        return "R@10" in self.values and "CIDEr-D" in self.values


def _number(options: dict[str, Any], key: str) -> float | None:
    value = options.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def point_values(report: dict[str, Any] | None) -> dict[str, float]:
    """A score file's metrics and its attached ``retrieval`` report's recalls and mean rank."""
    if not report:
        return {}
    values = {k: float(v) for k, v in report.get("metrics", {}).items() if isinstance(v, (int, float))}
    retrieval = report.get("retrieval") or {}
    values.update({k: float(retrieval[k]) for k in [*RECALLS, "mean_rank"] if k in retrieval})
    return values


def validation_values(report: dict[str, Any] | None, where: str = "score file") -> dict[str, float]:
    """A score report's validation numbers (``report["validation"]``: the val metrics of the epoch
    the evaluated checkpoint holds, :func:`caprl.evaluation.validation.numbers`, which refuses,
    naming ``where``, a section of other weights than the report's); {} without."""
    return validation.numbers(report, where)


def family_runs(params: dict[str, Any], dataset: str) -> list[RunSpec]:
    """The runs of paper 004's captioning methods (and frozen-speaker ablations) on the dataset."""
    specs = [run_spec(params, run) for run in compared_runs(params)]
    return [s for s in specs if s.method in FAMILY and dataset in s.datasets]


def family_points(params: dict[str, Any], dataset: str, scores: dict[str, dict[str, Any]]) -> list[Point]:
    """Every family run on the dataset as a point (params order), with its results if any."""
    points = []
    for spec in family_runs(params, dataset):
        init_run = spec.init.get("model")
        init_method = run_spec(params, init_run).method if init_run in params["runs"] else None
        report = scores.get(spec.name)
        where = f"scores.json of run {spec.name} on {dataset}"
        points.append(Point(spec, _number(spec.options, "lam"), _number(spec.options, "rho"), init_method,
                            init_run, point_values(report), validation_values(report, where)))
    return points


def table_rho(params: dict[str, Any]) -> float:
    return float(discriminative(params)["table_rho"])


def discriminative(params: dict[str, Any]) -> dict[str, Any]:
    section = params.get("discriminative")
    if not isinstance(section, dict) or "table_rho" not in section:
        raise CaprlError("params.yaml: the paper-004 tables and figures need a discriminative: section "
                         "(table_rho, operating_points)")
    return section


def method_points(points: list[Point], method: str, rho: float | None = None, model: str | None = None) -> list[Point]:
    """The method's points (of ρ ``rho`` where given; of ``model`` where given), in λ order."""
    chosen = [p for p in points if p.method == method and (rho is None or p.rho == rho)
              and (model is None or p.spec.model == model)]
    return sorted(chosen, key=lambda p: (p.lam is None, p.lam or 0.0))


def curve(points: list[Point], x: str, y: str, split: str = TEST, y_split: str | None = None) -> Curve:
    """(x, y) of every point having both numbers, in the points' (λ) order: of their test
    numbers (TEST), or of their validation numbers (VAL); ``y_split`` takes y from the other
    split (:func:`read_curve`)."""
    pairs = [(p.numbers(split), p.numbers(y_split or split)) for p in points]
    return [(vx[x], vy[y]) for vx, vy in pairs if x in vx and y in vy]


def read_curve(points: list[Point], x: str, y: str, chosen_on: str = TEST) -> Curve:
    """The curve a table cell is read on: x of the numbers the operating point was chosen on, y of
    the test numbers. Chosen on VAL, :func:`interpolate` at x0 then finds the two runs whose
    *validation* x brackets x0 and mixes their *test* y in the same proportion: which runs, and in
    what proportion, is decided on validation, and test only supplies the numbers read. (Read on
    the test x instead, a val-chosen x0 misses every test curve of a seed whose test split is
    easier or harder than its val split: paper 004's claims at a202f99, docs/004-psst.md.)"""
    return curve(points, x, y, chosen_on, TEST)


def on_validation(points: list[Point]) -> bool:
    """Whether the points carry validation numbers (then ``auto`` operating points are chosen on
    the validation curves)."""
    return any(p.val for p in points)


def models_of(params: dict[str, Any], points: list[Point]) -> list[str]:
    """The models the family's runs use, in params order."""
    used = {p.spec.model for p in points}
    return [m for m in params["models"] if m in used]


def decode_text(points: list[Point]) -> str:
    """The evaluation decoding of the runs shown ("beam 2"), or "decoding per run" if they differ."""
    how = {decoding_label(p.spec.decode) for p in points}
    return how.pop() if len(how) == 1 else ("no runs" if not how else "decoding per run")


# ---------------------------------------------------------------- operating points


@dataclass(frozen=True)
class OperatingPoint:
    value: float | None  # None: "auto" found no overlap
    key: str  # discriminative.operating_points.<dataset>.<name>
    auto: bool
    paper: float | None  # the paper's value at this point on this dataset, if it has one
    split: str = TEST  # auto: the curves it was chosen on (VAL: the validation curves; read on test)

    def describe(self, show: Callable[[float], str]) -> str:
        """"80.0% (params.yaml <key>, the paper's value)" or "auto: 78.0%, the highest ..."."""
        if self.value is None:
            return f"none (auto: no {'validation ' if self.split == VAL else ''}curve)"
        if self.auto and self.split == VAL:
            return (f"{show(self.value)} (auto, chosen on validation: the highest value the most compared "
                    "validation curves reach; test numbers read where each validation curve reaches it)")
        if self.auto:
            return f"{show(self.value)} (auto: the highest value the most compared curves reach)"
        same = self.paper is not None and abs(self.paper - self.value) < 1e-9
        paper = ", the paper's value" if same else (f", the paper's is {show(self.paper)}" if self.paper else "")
        return f"{show(self.value)} (params.yaml {self.key}{paper})"


def operating_point(params: dict[str, Any], dataset: str, name: str, auto: Callable[[], float | None],
                    paper: float | None = None, split: str = TEST) -> OperatingPoint:
    """``discriminative.operating_points.<dataset>.<name>``: a number, or ``auto`` (absent = auto),
    computed by ``auto()`` on the ``split`` curves (VAL: the validation curves)."""
    if name not in OPERATING_KEYS:
        raise ValueError(f"unknown operating point {name}")
    key = f"discriminative.operating_points.{dataset}.{name}"
    value = (discriminative(params).get("operating_points") or {}).get(dataset, {}).get(name, AUTO)
    if value == AUTO:
        return OperatingPoint(auto(), key, True, paper, split)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CaprlError(f"params.yaml {key}: expected a number or 'auto', got {value!r}")
    return OperatingPoint(float(value), key, False, paper)


def rho_curves(points: list[Point], method: str, model: str | None, split: str = TEST,
               y_split: str | None = None) -> tuple[dict[float, Curve], bool]:
    """The PSST method's (CIDEr-D, R@10) curve per ρ, of the ``split`` numbers (R@10 of ``y_split``'s
    where given: :func:`read_curve`); ρ = 0 from its ST method where no PSST run has ρ = 0 (True
    when it did)."""
    runs = [p for p in points if p.method == method and p.rho is not None and (model is None or p.spec.model == model)]
    curves = {rho: curve(method_points(runs, method, rho), "CIDEr-D", "R@10", split, y_split)
              for rho in sorted({p.rho for p in runs})}
    curves = {rho: c for rho, c in curves.items() if c}
    borrowed = 0.0 not in curves
    if borrowed:
        st = curve(method_points(points, PSST_METHODS[method], model=model), "CIDEr-D", "R@10", split, y_split)
        if st:
            curves[0.0] = st
        else:
            borrowed = False
    return dict(sorted(curves.items())), borrowed


#: (PSST method, model) -> (its curve per ρ, whether ρ = 0 is its ST method's): :func:`rho_curves` of each
RhoCurves = dict[tuple[str, str | None], tuple[dict[float, Curve], bool]]


def rho_reading(params: dict[str, Any], dataset: str, points: list[Point], models: list[str | None],
                paper: float | None = None) -> tuple[RhoCurves, OperatingPoint]:
    """Paper 004's Fig. 4 as the table ``psst_rho`` and the figure both read it: each PSST method's ρ
    curves of the complete ``points`` (x: the CIDEr-D of the numbers the point is chosen on, y: test
    R@10, :func:`read_curve`) and the ``rho_cider`` operating point. ``auto`` is chosen on the
    validation curves (every point of the family with validation numbers) where the points carry
    them (:func:`on_validation`), else on the test curves."""
    split = VAL if on_validation(points) else TEST
    done = [p for p in points if p.complete]
    curves = {(m, model): rho_curves(done, m, model, split, TEST) for model in models for m in PSST_METHODS}
    chosen_on = curves if split == TEST else {
        (m, model): rho_curves(points, m, model, VAL) for model in models for m in PSST_METHODS}
    op = operating_point(params, dataset, "rho_cider",
                         lambda: overlap_value(c for per_rho, _ in chosen_on.values() for c in per_rho.values()),
                         paper, split=split)
    return curves, op
