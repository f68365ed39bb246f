"""Rewards by configuration: the ``rewards:`` section of params.yaml.

Each entry names one reward instance; objectives refer to it by that name::

    rewards:
      cider_d: {kind: cider_d, eos: true}           # options: sigma, eos
      cider_d_noeos: {kind: cider_d, eos: false}
      bcmr:    {kind: mix, weights: {bleu4: 0.25, cider_d: 0.25, meteor: 0.25, rouge_l: 0.25}, eos: true}
      spider:  {kind: mix, weights: {cider_d: 0.5, spice: 0.5}, eos: true}
      clip_s:  {kind: clip_s, embedding: clip, model: openai/clip-vit-base-patch32, listener: listener,
                prompt: A photo depicts, w: 2.5}     # Cho et al. 2022 (caprl.rewards.clip_s)
    spice:
      corenlp_dir: null    # folder of stanford-corenlp-3.6.0{,-models}.jar (or $CAPRL_CORENLP_DIR)

``kind`` is a reward factory of :mod:`caprl.rewards.registry` (``cider_d``, ``bleu1``..``bleu4``,
``rouge_l``, ``meteor``, ``spice``, ``clip_s``) or ``mix`` (a weighted sum of factories; a ``sigma``
option of a mix goes to its CIDEr-D component, the embedding options to its clip_s component).

``eos`` is the reward text's convention, one per paper (every reward a paper's runs use has its
paper's), over the :class:`caprl.rewards.references.RewardReferences` the trainer gives:

* ``true``, self-critical.pytorch's (``captioning/utils/rewards.py`` ``get_self_critical_reward``):
  the references are the training labels (``data['gts']``: each caption clipped to
  ``vocab.max_length``, rare words UNK) and the end token is a word where ``array_to_str`` writes
  it: after a caption shorter than ``decode.max_length`` and after a label shorter than the label
  arrays' width, whatever ``decode.max_length`` is; CIDEr-D's document frequencies count the full
  training captions, rare words UNK, each with the end (``scripts/prepro_ngrams.py``). Papers 000
  and 004's code (Stack-Captioning, DiscCaptioning: ``misc/rewards.py``) is SCP's; 001 and 003 have
  no public code: SCP's practice.
* ``false``, marshimarocj/caption_competition's (paper 002; ``gen_model/trntst_util.py``
  ``eval_cider_in_rollout`` over ``service/fast_cider.py`` ``CiderScorer``): the references are
  the captions as written (``human_caption_dict.pkl``: full length, no UNK), the sampled captions
  are the words before the end (tf_expr_framework ``util/caption/utility.py`` ``CaptionInt2str``
  stops at EOS and drops it), no end token anywhere; the document frequencies are the
  ``caprl cider-df`` file's (the training captions).

:func:`reward_unavailable_reason` says, without starting a JVM, why a configured reward cannot run
here (SPICE without the CoreNLP jars); :func:`build_configured_reward` builds it on top of
:func:`caprl.rewards.registry.build_reward`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from caprl.errors import CaprlError
from caprl.rewards.base import Reward
from caprl.rewards.document_frequencies import DocumentFrequencies
from caprl.rewards.references import RewardReferences
from caprl.rewards.registry import FACTORIES, References, build_mix, build_reward

MIX = "mix"

# kind -> option name -> check(value) -> error text or None; a new kind is one entry here
_Check = Callable[[Any], "str | None"]


def _positive_number(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return None if ok else f"must be a positive number, got {value!r}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) and value else f"must be a non-empty string, got {value!r}"


def _embedding(value: Any) -> str | None:
    from caprl.metrics.embeddings import EMBEDDINGS

    return None if value in EMBEDDINGS else f"must be one of {', '.join(EMBEDDINGS)}, got {value!r}"


def _weights(value: Any) -> str | None:
    if not isinstance(value, Mapping) or not value:
        return f"must be a non-empty mapping {{component kind: weight}}, got {value!r}"
    return None


# clip_s: the embedding (caprl.metrics.embeddings.EmbeddingSpec) and CLIP-S's weight w
CLIP_S_OPTIONS: dict[str, _Check] = {"embedding": _embedding, "model": _string, "listener": _string,
                                     "prompt": _string, "w": _positive_number}
OPTIONS: dict[str, dict[str, _Check]] = {
    **{kind: {"eos": _boolean} for kind in FACTORIES},  # eos: the reward text's convention (above)
    "cider_d": {"sigma": _positive_number, "eos": _boolean},
    "clip_s": CLIP_S_OPTIONS,  # reads no references
    MIX: {"weights": _weights, "sigma": _positive_number, "eos": _boolean, **CLIP_S_OPTIONS},
}
REQUIRED: dict[str, tuple[str, ...]] = {MIX: ("weights",), "clip_s": tuple(CLIP_S_OPTIONS)}


def reward_config(name: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(kind, options)`` of ``params["rewards"][name]``, validated; errors name the key."""
    section = params.get("rewards") or {}
    if not isinstance(section, Mapping):
        raise CaprlError(f"rewards: must be a mapping of reward name -> {{kind: ..., options}}, got {section!r}")
    if name not in section:
        known = ", ".join(sorted(section)) or "none"
        raise CaprlError(f"rewards.{name}: no such reward in params.yaml (configured: {known})")
    entry = section[name]
    if not isinstance(entry, Mapping):
        raise CaprlError(f"rewards.{name}: must be a mapping {{kind: ..., options}}, got {entry!r}")
    options = dict(entry)
    kind = options.pop("kind", None)
    if kind not in OPTIONS:
        raise CaprlError(f"rewards.{name}.kind: unknown kind {kind!r}; choose from {', '.join(sorted(OPTIONS))}")
    for key, value in options.items():
        if key not in OPTIONS[kind]:
            allowed = ", ".join(sorted(OPTIONS[kind])) or "none"
            raise CaprlError(f"rewards.{name}.{key}: unknown option for kind {kind!r} (allowed: {allowed})")
        problem = OPTIONS[kind][key](value)
        if problem:
            raise CaprlError(f"rewards.{name}.{key}: {problem}")
    for key in REQUIRED.get(kind, ()):
        if key not in options:
            raise CaprlError(f"rewards.{name}.{key}: required for kind {kind!r}")
    if kind == MIX:
        options["weights"] = _mix_weights(name, options["weights"])
        for component in options["weights"]:  # a mix carries the options its components require
            missing = [key for key in REQUIRED.get(component, ()) if key not in options]
            if missing:
                raise CaprlError(f"rewards.{name}.{missing[0]}: required by its component {component!r} "
                                 f"(set {', '.join(missing)})")
    return kind, options


def _mix_weights(name: str, weights: Mapping[Any, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for component, weight in weights.items():
        key = f"rewards.{name}.weights.{component}"
        if component not in FACTORIES:
            raise CaprlError(f"{key}: unknown component kind; choose from {', '.join(sorted(FACTORIES))}")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise CaprlError(f"{key}: weight must be a number, got {weight!r}")
        out[str(component)] = float(weight)
    return out


def component_kinds(name: str, params: Mapping[str, Any]) -> list[str]:
    """The factory kinds a configured reward uses (its own kind, or a mix's components)."""
    kind, options = reward_config(name, params)
    return list(options["weights"]) if kind == MIX else [kind]


def corenlp_dir(params: Mapping[str, Any]) -> str | None:
    """``spice.corenlp_dir`` of params (None if absent: then $CAPRL_CORENLP_DIR is used)."""
    spice = params.get("spice") or {}
    if not isinstance(spice, Mapping):
        raise CaprlError(f"spice: must be a mapping {{corenlp_dir: ...}}, got {spice!r}")
    value = spice.get("corenlp_dir")
    if value is not None and not isinstance(value, str):
        raise CaprlError(f"spice.corenlp_dir: must be a path or null, got {value!r}")
    return value


def reward_unavailable_reason(name: str, params: Mapping[str, Any]) -> str | None:
    """Why configured reward ``name`` cannot run here, or None. Cheap: checks files only.

    Only SPICE (alone or in a mix) can be unavailable; no JVM is started. A bad
    configuration raises CaprlError naming the key.
    """
    kinds = component_kinds(name, params)
    if "spice" not in kinds:
        return None
    from caprl.metrics.official import spice_unavailable_reason

    reason = spice_unavailable_reason(corenlp_dir(params))
    if reason is None:
        return None
    via = "" if kinds == ["spice"] else " (its component 'spice')"
    return f"reward '{name}'{via} needs SPICE, which is unavailable: {reason}"


def embedding_spec(name: str, params: Mapping[str, Any]) -> Any:
    """The :class:`caprl.metrics.embeddings.EmbeddingSpec` a configured reward's clip_s (alone or in a
    mix) embeds with; None for a reward without clip_s."""
    if "clip_s" not in component_kinds(name, params):
        return None
    from caprl.metrics.embeddings import EmbeddingSpec

    return EmbeddingSpec.from_dict(reward_config(name, params)[1], f"rewards.{name}")


def build_configured_reward(
    name: str,
    params: Mapping[str, Any],
    references: RewardReferences | References,
    document_frequencies: DocumentFrequencies | None,
    embeddings: Callable[[Any], Any] | None = None,
) -> Reward:
    """Build the reward ``params["rewards"][name]`` describes (named ``name``); ``embeddings``
    (spec -> embedding) feeds a clip_s component.

    ``references``: the training split's :class:`RewardReferences` (captions and labels); a plain
    mapping image id -> captions stands for captions without a vocabulary, its labels clipped to
    ``vocab.max_length``. ``eos`` picks the texts and where the end counts (the module's docstring);
    the end of a sampled caption counts below ``decode.max_length``, the decode's limit.

    Raises CaprlError with the reason when it is unavailable here (see
    :func:`reward_unavailable_reason`).
    """
    kind, options = reward_config(name, params)
    reason = reward_unavailable_reason(name, params)
    if reason is not None:
        raise CaprlError(reason)
    if "spice" in (options["weights"] if kind == MIX else [kind]):
        options["corenlp_dir"] = corenlp_dir(params)
    if options.pop("eos", False):  # self-critical.pytorch's reward text: the labels, the end counted
        refs = _reward_references(references, params)
        texts: References = refs.labels
        options.update(eos=True, max_length=int(params["decode"]["max_length"]),
                       reference_length=refs.label_length, df_corpus=refs.unk_captions)
    else:  # caption_competition's: the captions as written
        texts = references.captions if isinstance(references, RewardReferences) else references
    if kind == MIX:
        weights = options.pop("weights")
        return build_mix(name, weights, texts, document_frequencies, embeddings, **options)
    reward = build_reward(kind, texts, document_frequencies, embeddings, **options)
    reward.name = name
    return reward


def _reward_references(references: RewardReferences | References, params: Mapping[str, Any]) -> RewardReferences:
    if isinstance(references, RewardReferences):
        return references
    return RewardReferences.from_captions(references, int(params["vocab"]["max_length"]))
