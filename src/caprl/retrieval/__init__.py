"""Image-caption retrieval: the listener (VSE++-style embedding), its hinge loss, recall@K.

Shared by the discriminative-captioning methods (paper 004: the listener) and the
actor-critic's embedding reward (paper 003): one embedding model, not two.
"""

from caprl.retrieval.listener import Listener, ListenerConfig, caption_lengths
from caprl.retrieval.losses import vse_hinge, vse_sum_hinge
from caprl.retrieval.metrics import RECALL_KS, ranks_of, recall_report

__all__ = ["Listener", "ListenerConfig", "caption_lengths", "vse_hinge", "vse_sum_hinge", "RECALL_KS", "ranks_of", "recall_report"]
