"""In-process rewards for RL (CIDEr-D, BLEU, mixes) and CIDEr-D document frequencies.

``build_reward(name, references, document_frequencies, **options)`` returns a
:class:`Reward`: ``reward(image_ids, captions) -> np.ndarray[float64]``, captions being
lists of words tokenised like the references.
``build_configured_reward(name, params, references, document_frequencies)`` builds the
reward ``params["rewards"][name]`` configures over a split's :class:`RewardReferences` (the
captions, and the labels SCP's reward reads: its ``eos`` option); ``reward_unavailable_reason(name,
params)`` says (cheaply, no JVM) why it cannot run here, or None.
"""

from caprl.rewards.base import Reward
from caprl.rewards.bleu import corpus_bleu, leave_one_out_bleu, pairwise_bleu, sentence_bleu
from caprl.rewards.config import build_configured_reward, reward_unavailable_reason
from caprl.rewards.document_frequencies import (
    DocumentFrequencies,
    compute_document_frequencies,
    load_document_frequencies,
    references_from_annotations,
    save_document_frequencies,
)
from caprl.rewards.references import ReferenceSet, RewardReferences
from caprl.rewards.registry import MIXES, available_rewards, build_mix, build_reward

__all__ = [
    "MIXES",
    "DocumentFrequencies",
    "ReferenceSet",
    "Reward",
    "RewardReferences",
    "available_rewards",
    "build_configured_reward",
    "build_mix",
    "build_reward",
    "compute_document_frequencies",
    "corpus_bleu",
    "leave_one_out_bleu",
    "load_document_frequencies",
    "pairwise_bleu",
    "references_from_annotations",
    "reward_unavailable_reason",
    "save_document_frequencies",
    "sentence_bleu",
]
