"""Paper 004's published numbers (PSST, Partial-Sampling Straight-Through), typed in as data.

Discriminative captioning: a speaker and a listener trained jointly, each method at several λ.
Rows are keyed by our method names (:data:`caprl.tables.operating.METHOD_LABELS`); a method
the paper's table has no numbers for is absent.

* Table 1 (COCO) and Table 6 (Flickr30K): CIDEr, BLEU4, METEOR, ROUGE, SPICE as fractions
  (as printed, 3 decimals) at a fixed R@5 (80% on COCO, 90% on Flickr30K). Luo et al. 2018 has
  no row in Table 1 and an empty one in Table 6 ("did not reach 90% recall").
* Table 2 (COCO): R@1, R@5, R@10 in % at CIDEr = 1.2; PSST with ρ = 0.25.
* Table 3 (COCO): the ablations, R@1, R@5, R@10 in % at CIDEr = 1.13.
* Fig. 4 (COCO): recall@10 against ρ read at CIDEr = 1.22 (the caption's value).
"""

from __future__ import annotations

Row = dict[str, float]

PAPER = "paper 004 (PSST)"
LANGUAGE_KEYS = "CIDEr-D BLEU-4 METEOR ROUGE-L SPICE"
RECALL_KEYS = "R@1 R@5 R@10"


def _row(columns: str, *values: float) -> Row:
    return dict(zip(columns.split(), values, strict=True))


#: Table 1: COCO, language metrics at R@5 = 80%.
TABLE1: dict[str, Row] = {
    "reinforce_joint": _row(LANGUAGE_KEYS, 0.902, 0.251, 0.247, 0.505, 0.189),
    "st_gumbel": _row(LANGUAGE_KEYS, 1.087, 0.288, 0.253, 0.528, 0.187),
    "st_multinomial": _row(LANGUAGE_KEYS, 1.106, 0.300, 0.259, 0.542, 0.194),
    "psst_gumbel": _row(LANGUAGE_KEYS, 1.109, 0.320, 0.263, 0.541, 0.205),
    "psst_multinomial": _row(LANGUAGE_KEYS, 1.119, 0.322, 0.264, 0.544, 0.206),
}

#: Table 2: COCO, recall in % at CIDEr = 1.2 (PSST with ρ = 0.25).
TABLE2: dict[str, Row] = {
    "luo2018": _row(RECALL_KEYS, 16.1, 41.5, 55.8),
    "reinforce_joint": _row(RECALL_KEYS, 31.3, 67.0, 80.5),
    "st_gumbel": _row(RECALL_KEYS, 31.8, 67.3, 80.6),
    "st_multinomial": _row(RECALL_KEYS, 31.9, 67.9, 81.8),
    "psst_gumbel": _row(RECALL_KEYS, 37.6, 73.0, 85.7),
    "psst_multinomial": _row(RECALL_KEYS, 38.1, 74.2, 86.3),
}

#: Table 3: COCO ablations, recall in % at CIDEr = 1.13; keyed by row kind: a method, or
#: ``frozen_speaker:<init method>`` (Luo = luo2018, MLE = xe).
TABLE3: dict[str, Row] = {
    "luo2018": _row(RECALL_KEYS, 27.7, 60.1, 74.6),
    "frozen_speaker:luo2018": _row(RECALL_KEYS, 32.6, 67.8, 81.8),
    "frozen_speaker:xe": _row(RECALL_KEYS, 19.3, 46.9, 61.3),
    "reinforce_joint": _row(RECALL_KEYS, 38.9, 74.0, 86.2),
}

#: Table 6: Flickr30K, language metrics at R@5 = 90% (Luo et al. 2018: no numbers).
TABLE6: dict[str, Row] = {
    "reinforce_joint": _row(LANGUAGE_KEYS, 0.431, 0.173, 0.188, 0.435, 0.129),
    "st_gumbel": _row(LANGUAGE_KEYS, 0.484, 0.213, 0.188, 0.455, 0.125),
    "st_multinomial": _row(LANGUAGE_KEYS, 0.478, 0.212, 0.188, 0.452, 0.124),
    "psst_gumbel": _row(LANGUAGE_KEYS, 0.485, 0.207, 0.188, 0.447, 0.126),
    "psst_multinomial": _row(LANGUAGE_KEYS, 0.488, 0.213, 0.190, 0.448, 0.129),
}

#: The paper's operating points, per dataset, on the metric's own scale (operating-point keys of
#: ``discriminative.operating_points``): Table 1 / 6 (recall5), Table 2 (cider), Table 3
#: (ablation_cider), Fig. 4 (rho_cider).
OPERATING_POINTS: dict[str, dict[str, float]] = {
    "coco": {"recall5": 0.80, "cider": 1.2, "ablation_cider": 1.13, "rho_cider": 1.22},
    "flickr30k": {"recall5": 0.90},
}

#: Where each table's paper numbers apply.
HOME: dict[str, str] = {"psst_table1": "coco", "psst_table2": "coco", "psst_table3": "coco",
                        "psst_table6": "flickr30k"}

#: What the paper says of its Table 6's Luo row (empty in the table).
TABLE6_LUO_NOTE = "The paper: the method of Luo et al. (2018a) did not reach 90% recall on Flickr30K."
