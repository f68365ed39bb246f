"""Paper 003's published numbers (Shi et al., "Image captioning based on deep reinforcement
learning"), typed in as data.

Table 1: MS COCO (Karpathy's split, test), BLEU-3, BLEU-4, METEOR, CIDEr in %, in the paper's
row order; "-" in the paper ("unknown scores") is absent here. The paper's "Ours" row is its
policy and value networks together (the value network "makes decisions on whether to choose
the action given by the policy network"), i.e. lookahead inference, which we compare with our
actor-critic run's lookahead captions. The paper writes CIDEr; coco-caption's CIDEr is
CIDEr-D, our column.
"""

from __future__ import annotations

Row = dict[str, float]

PAPER = "paper 003 (Shi et al.)"
KEYS = "BLEU-3 BLEU-4 METEOR CIDEr-D"  # our score-file names of the paper's four columns


def _row(*values: float | None) -> Row:
    return {k: v for k, v in zip(KEYS.split(), values, strict=True) if v is not None}


#: Table 1, the prior methods, as printed (label, row).
TABLE1_PRIOR: list[tuple[str, Row]] = [
    ("DeepVS [4]", _row(32.1, 23.0, 19.5, 66.0)),
    ("NIC [5]", _row(32.9, 27.7, 23.7, 85.5)),
    ("gLSTM [9]", _row(35.8, 26.4, 22.7, 81.3)),
    ("m-RNN [11]", _row(35.0, 25.0, None, None)),
    ("ATT [7]", _row(40.2, 30.4, 24.3, None)),  # Semantic ATT: extra training data (the paper's remark)
]

#: Table 1, "Ours": the paper's method (policy + value network).
TABLE1_OURS: Row = _row(39.5, 28.2, 24.3, 90.7)
