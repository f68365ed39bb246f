"""Rewards by name: ``build_reward(name, references, document_frequencies, **options)``.

Names: ``cider_d``, ``bleu1``..``bleu4`` (in-process, vectorised), ``rouge_l`` (pycocoevalcap's
ROUGE-L numbers with a bit-parallel LCS), ``meteor`` (pycocoevalcap's METEOR: one JVM per reward, closed by
``close()``), ``spice`` (official SPICE through one long-lived JVM, see
:mod:`caprl.metrics.spice_server`; building it raises CaprlError with the reason when
SPICE cannot run here), ``clip_s`` (CLIP-S in an image-text embedding, :mod:`caprl.rewards.clip_s`:
the caller passes ``embeddings=``, a function spec -> embedding) and weighted mixes (:data:`MIXES`):
a mix is one dict entry of component name -> weight, and ``weights=`` overrides the default weights.

``eos=True`` scores the reward text as self-critical.pytorch writes it (``captioning/utils/rewards.py``
``array_to_str``: the end token is a word of every caption and reference that has one,
:class:`caprl.rewards.cider.EndToken`) in every component that compares word sequences in-process:
CIDEr-D (SCP's reward), BLEU (SCP's ``get_self_critical_reward`` scores BLEU on the same strings)
and ROUGE-L (:data:`ENDED`). METEOR and SPICE parse sentences, where an end token is no word, and
CLIP-S reads no references: they score the captions as written, against the same references.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from caprl.errors import CaprlError
from caprl.rewards.base import MemoizedReward, Reward
from caprl.rewards.bleu import Bleu
from caprl.rewards.cider import CiderD, EndOfCaption, EndToken, ended_map, ended_references
from caprl.rewards.document_frequencies import DocumentFrequencies, compute_document_frequencies
from caprl.rewards.references import ReferenceSet
from caprl.rewards.rouge import ReferenceMasks, rouge_l

References = Mapping[int, Sequence[Sequence[str]]]

# Mixes: name -> {component: weight}. SPIDEr = (CIDEr-D + SPICE) / 2 (PG-SPIDEr). BCMR mixes
# BLEU-4, CIDEr-D, METEOR and ROUGE-L with weights the shared PG-SPIDEr summary does not
# give: they must be passed (weights={...}, from params.yaml); no number is made up here.
MIXES: dict[str, dict[str, float] | None] = {
    "spider": {"cider_d": 0.5, "spice": 0.5},
    "bcmr": None,
}
MIX_COMPONENTS: dict[str, tuple[str, ...]] = {"bcmr": ("bleu4", "cider_d", "meteor", "rouge_l")}


class _Context:
    """What the components of one ``build_reward`` call share: the references (prepared once), the
    embeddings of ``clip_s`` (a function spec -> embedding, or None where the caller has none) and
    where the end token counts (None: nowhere)."""

    def __init__(self, references: References, document_frequencies: DocumentFrequencies | None,
                 embeddings: Callable[[Any], Any] | None = None, end: EndToken | None = None) -> None:
        self.references = references
        self.document_frequencies = document_frequencies
        self.embeddings = embeddings
        self.end = end

    @cached_property
    def reference_set(self) -> ReferenceSet:
        """The references of the n-gram rewards (CIDEr-D, BLEU), with the end where it counts."""
        df = self.document_frequencies
        if self.end is not None:
            return ended_references(self.references, self.end, df)
        if df is None:  # CiderScorer's own convention: df from the references being scored
            df = compute_document_frequencies(self.references)
        return ReferenceSet(self.references, df)

    @cached_property
    def sentences(self) -> dict[int, list[str]]:
        """The references as sentences, as written (METEOR, SPICE)."""
        return {int(i): [" ".join(r) for r in refs] for i, refs in self.references.items()}

    @cached_property
    def token_sentences(self) -> dict[int, list[str]]:
        """The references as sentences with the end where it counts (ROUGE-L)."""
        if self.end is None:
            return self.sentences
        ended = ended_map(self.references, self.end.reference_length)
        return {int(i): [" ".join(r) for r in refs] for i, refs in ended.items()}


def _sentences_of(captions: Sequence[Sequence[str]]) -> list[str]:
    return [" ".join(c) for c in captions]


class RougeL(MemoizedReward):
    """pycocoevalcap's ROUGE-L (beta 1.2) of each caption against its image's references, with a
    bit-parallel LCS (:mod:`caprl.rewards.rouge`: the same floats, ~20x faster)."""

    name = "rouge_l"

    def __init__(self, context: _Context) -> None:
        super().__init__()
        self._refs = context.token_sentences
        self._masks: dict[int, list[ReferenceMasks]] = {}

    def score(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        for i, refs in zip(image_ids, _lookup(self._refs, image_ids)):  # each image's masks made once
            if int(i) not in self._masks:
                self._masks[int(i)] = [ReferenceMasks(s) for s in refs]
        return np.array([rouge_l(c, self._masks[int(i)]) for i, c in zip(image_ids, _sentences_of(captions))],
                        dtype=np.float64)


class Meteor(MemoizedReward):
    """pycocoevalcap's METEOR through one long-lived JVM (closed by :meth:`close`). A segment's
    score comes from its own statistics only (the JVM's ``EVAL`` line), hence the cache."""

    name = "meteor"

    def __init__(self, context: _Context) -> None:
        from caprl.metrics.official import OfficialScorer

        super().__init__()
        self._scorer = OfficialScorer()
        self._refs = context.sentences

    def score(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        if not captions:
            return np.zeros(0)
        refs = _lookup(self._refs, image_ids)
        gts = dict(enumerate(refs))
        res = {i: [c] for i, c in enumerate(_sentences_of(captions))}
        _, scores = self._scorer.meteor(gts, res)
        return np.asarray(scores, dtype=np.float64)

    def close(self) -> None:
        self._scorer.close()


class Spice(MemoizedReward):
    """Official SPICE F-score (all tuples) from one long-lived SPICE JVM (closed by :meth:`close`).

    Building it fails with the reason when SPICE cannot run here (see
    :func:`caprl.metrics.official.spice_classpath`); ``corenlp_dir`` is where the Stanford
    CoreNLP 3.6.0 jars are (None: ``$CAPRL_CORENLP_DIR``, then pycocoevalcap's ``spice/lib``).
    """

    name = "spice"

    def __init__(self, context: _Context, corenlp_dir: str | None = None) -> None:
        from caprl.metrics.official import MetricUnavailable, spice_classpath
        from caprl.metrics.spice_server import SpiceServer, java_command

        try:
            classpath = spice_classpath(corenlp_dir)
        except MetricUnavailable as exc:
            raise CaprlError(f"reward 'spice' is unavailable: {exc}") from None
        super().__init__()
        self._refs = context.sentences
        self._server = SpiceServer(java_command(classpath))

    def score(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        if not captions:
            return np.zeros(0)
        refs = _lookup(self._refs, image_ids)
        scores = self._server.f_scores(list(zip(_sentences_of(captions), refs, strict=True)))
        return np.asarray(scores, dtype=np.float64)

    def close(self) -> None:
        self._server.close()


class Mix(Reward):
    """A weighted sum of component rewards."""

    def __init__(self, name: str, components: dict[str, Reward], weights: Mapping[str, float]) -> None:
        self.name = name
        self.components = components
        self.weights = dict(weights)

    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
        self.check_batch(image_ids, captions)
        total = np.zeros(len(captions))
        for key, reward in self.components.items():
            total += self.weights[key] * reward(image_ids, captions)
        return total

    def close(self) -> None:
        for reward in self.components.values():
            reward.close()


def _lookup(refs: Mapping[int, list[str]], image_ids: Sequence[int]) -> list[list[str]]:
    try:
        return [refs[int(i)] for i in image_ids]
    except KeyError as exc:
        raise CaprlError(f"image id {exc.args[0]} has no reference captions in this reward's references") from None


def _cider_d(context: _Context, sigma: float = 6.0) -> Reward:
    """CIDEr-D over the context's references (with the end where it counts: :data:`ENDED`)."""
    return CiderD(context.reference_set, sigma=sigma)


def _bleu(n: int) -> Callable[[_Context], Reward]:
    return lambda context: Bleu(context.reference_set, n)


def _clip_s(context: _Context, embedding: str, model: str, listener: str, prompt: str, w: float) -> Reward:
    """CLIP-S (Cho et al. 2022's reward): ``w * max(cos, 0)`` in the embedding the options name."""
    from caprl.rewards.clip_s import build_clip_s

    return build_clip_s(context.embeddings, embedding, model, listener, prompt, w)


# name -> factory(context, **options); a new reward is one entry here
FACTORIES: dict[str, Callable[..., Reward]] = {
    "cider_d": _cider_d,
    **{f"bleu{n}": _bleu(n) for n in range(1, 5)},
    "rouge_l": RougeL,
    "meteor": Meteor,
    "spice": Spice,
    "clip_s": _clip_s,
}


#: the components that score the end token as a word where the reward counts it (``eos``)
ENDED = frozenset({"cider_d", *(f"bleu{n}" for n in range(1, 5)), "rouge_l"})


def available_rewards() -> list[str]:
    """Every name :func:`build_reward` accepts."""
    return sorted(FACTORIES) + sorted(MIXES)


def build_reward(
    name: str,
    references: References,
    document_frequencies: DocumentFrequencies | None = None,
    embeddings: Callable[[Any], Any] | None = None,
    *,
    eos: bool = False,
    max_length: int = 16,
    reference_length: int | None = None,
    df_corpus: References | None = None,
    **options: Any,
) -> Reward:
    """Build reward ``name`` over ``references`` (image id -> tokenised captions).

    ``document_frequencies`` feeds CIDEr-D (None: computed from ``references``); ``embeddings``
    (spec -> embedding) feeds clip_s. ``eos``: the end counts as a word (the module's docstring)
    after a caption shorter than ``max_length`` (the decode's limit) and after a reference shorter
    than ``reference_length`` (the label arrays' width; None: ``max_length``), CIDEr-D's document
    frequencies from ``df_corpus`` (None: the references), each caption with its end. Options:
    ``sigma`` (cider_d), ``corenlp_dir`` (spice), ``embedding``, ``model``, ``listener``,
    ``prompt``, ``w`` (clip_s), ``weights`` (mixes: component -> weight; a mix passes its other
    options to the components that take them).
    """
    end = _end(eos, max_length, reference_length, df_corpus)
    return _build(name, _Context(references, document_frequencies, embeddings, end), dict(options))


def build_mix(
    name: str,
    weights: Mapping[str, float],
    references: References,
    document_frequencies: DocumentFrequencies | None = None,
    embeddings: Callable[[Any], Any] | None = None,
    *,
    eos: bool = False,
    max_length: int = 16,
    reference_length: int | None = None,
    df_corpus: References | None = None,
    **options: Any,
) -> Mix:
    """A mix named ``name``: ``sum(weight * FACTORIES[component])`` (options as :func:`build_reward`)."""
    end = _end(eos, max_length, reference_length, df_corpus)
    return _build_mix(name, weights, _Context(references, document_frequencies, embeddings, end), dict(options))


def _end(eos: bool, max_length: int, reference_length: int | None, df_corpus: References | None) -> EndToken | None:
    if not eos:
        return None
    return EndToken(int(max_length), int(max_length if reference_length is None else reference_length), df_corpus)


def _accepts(factory: Callable[..., Reward]) -> set[str]:
    return {p for p in inspect.signature(factory).parameters if p != "context"}


def _build_mix(name: str, weights: Mapping[str, float], context: _Context, options: dict[str, Any]) -> Mix:
    unknown = [k for k in weights if k not in FACTORIES]
    if unknown:
        raise CaprlError(f"reward '{name}': unknown component(s) {', '.join(unknown)}")
    unused = sorted(set(options) - set().union(*(_accepts(FACTORIES[k]) for k in weights)))
    if unused:
        raise CaprlError(f"reward '{name}': bad options {unused}: no component of {sorted(weights)} takes them")
    components: dict[str, Reward] = {}
    try:
        for key in weights:
            own = {k: v for k, v in options.items() if k in _accepts(FACTORIES[key])}
            components[key] = _build(key, context, own)
    except CaprlError as exc:
        for built in components.values():
            built.close()
        raise CaprlError(f"reward '{name}': component {exc}") from exc
    return Mix(name, components, weights)


def _build(name: str, context: _Context, options: dict[str, Any]) -> Reward:
    if name in MIXES:
        given = options.pop("weights", None) or MIXES[name]
        if given is None:
            raise CaprlError(
                f"reward '{name}' needs explicit weights for {', '.join(MIX_COMPONENTS[name])} "
                "(pass weights={component: weight}); the PG-SPIDEr summary gives none"
            )
        return _build_mix(name, given, context, options)
    if name not in FACTORIES:
        raise CaprlError(f"unknown reward '{name}'; available: {', '.join(available_rewards())}")
    factory = FACTORIES[name]
    try:
        inspect.signature(factory).bind(context, **options)
    except TypeError as exc:
        raise CaprlError(f"reward '{name}': bad options {sorted(options)}: {exc}") from exc
    reward = factory(context, **options)
    if context.end is not None and name in ENDED:
        return EndOfCaption(reward, context.end.candidate_length)
    return reward
