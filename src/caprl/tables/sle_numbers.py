"""The SLE paper's published numbers, typed in as data.

Jia Chen and Qin Jin, "Better Captioning with Sequence-Level Exploration" (CVPR 2020):
SLL = sequence-level learning (REINFORCE with the greedy caption as baseline, CIDEr
reward), SLL-ME = SLL + maximum-entropy regularisation (weight 1e-2), SLL-SLE = SLL +
sequence-level exploration (alpha = .75). Every number is decoded with beam search of
width 5 unless the row says rs (5 random samples). A metric the paper prints as NA is
absent from its row.

* Tables 2 and 3: METEOR (M), CIDEr (C), SPICE (S) in %, MSCOCO Karpathy test (Table 2)
  and TGIF official test split (Table 3). Table 2's rows marked * use bottom-up region
  features with an attention architecture; the other SLL rows use the mean-pooled
  ResNet-152 feature without attention, as does Table 3 (spatio-temporal mean pooling).
* Table 4 (MSCOCO): precision = CIDEr in % (the mean over the 5 captions of an image),
  diversity = Div-1, Div-2 (higher = more diverse) and mBLEU-4 (lower = more diverse) as
  fractions; 5 random samples (rs) or the top 5 beams (bs). Its bs CIDEr equal Table 2's
  SLL / SLL-ME / SLL-SLE rows without attention: it is the model without attention.

Our rows are keyed by row kind (see :data:`caprl.tables.sle.ROW_KINDS`): ``xe``, ``sll``,
``sll_me``, ``sll_sle``; Tables 2-3 also by attention (True = the paper's * rows).

Where the text and the tables disagree (:data:`TEXT_GAINS`, the differences the text states):

* Table 3 as printed (:data:`TABLE3`) has its SLL and SLL-ME rows swapped relative to sec.
  5.3, which says "SLL-ME performs worse than SLL on all metrics" and "SLL-SLE improves over
  SLL by 0.6 on Meteor, 2.7 on CIDEr and 0.6 on SPICE": both hold with the rows exchanged
  (SLL-SLE minus the printed SLL-ME row is 0.6 / 2.7 / 0.6). :data:`TABLE3_TEXT` is the
  text-consistent assignment, which our rows are compared with; the printed rows are shown too.
* Table 2: sec. 5.2 gives SLL-SLE's CIDEr gain over SLL-ME as 1.8, the table 117.2 - 115.6 =
  1.6 (its other stated gains match). We keep the table's numbers.
"""

from __future__ import annotations

Row = dict[str, float]

PAPER = "SLE (Chen & Jin, CVPR 2020)"


def _row(columns: str, *values: float | None) -> Row:
    return {c: v for c, v in zip(columns.split(), values, strict=True) if v is not None}


_MCS = "M C S"
_T4 = "C Div-1 Div-2 mBLEU-4"

#: Table 2, first block: prior methods (paper lines "NIC [32] 23.7 85.5 NA" ... "Top-Down-SLL [2] 26.5 111.1 20.2").
TABLE2_PRIOR: list[tuple[str, Row]] = [
    ("NIC [32]", _row(_MCS, 23.7, 85.5, None)),
    ("Adaptive [17]", _row(_MCS, 26.6, 108.5, None)),
    ("SCST:FC [24]", _row(_MCS, 25.5, 106.3, None)),
    ("SCST:Att2in [24]", _row(_MCS, 26.3, 111.4, None)),
    ("Top-Down-XE [2]", _row(_MCS, 26.1, 105.4, 19.2)),
    ("Top-Down-SLL [2]", _row(_MCS, 26.5, 111.1, 20.2)),
]

#: Table 2, middle block (no attention, False) and last block (attention, *: True).
TABLE2: dict[bool, dict[str, Row]] = {
    False: {
        "sll": _row(_MCS, 26.8, 115.0, 20.0),  # SLL
        "sll_me": _row(_MCS, 26.8, 115.6, 20.1),  # SLL-ME
        "sll_sle": _row(_MCS, 27.0, 117.2, 20.3),  # SLL-SLE (ours)
    },
    True: {
        "sll": _row(_MCS, 26.6, 117.2, 19.4),  # SLL*
        "sll_me": _row(_MCS, 26.7, 117.9, 19.5),  # SLL-ME*
        "sll_sle": _row(_MCS, 27.0, 119.6, 19.9),  # SLL-SLE* (ours)
    },
}

#: Table 3 (TGIF), prior methods.
TABLE3_PRIOR: list[tuple[str, Row]] = [
    ("Official [15]", _row(_MCS, 16.7, 31.6, None)),
    ("Show-adapt [7]", _row(_MCS, 16.2, 29.8, None)),
]

#: Table 3 (TGIF), the paper's SLL rows (no attention: spatio-temporal mean pooling).
TABLE3: dict[bool, dict[str, Row]] = {
    False: {
        "sll": _row(_MCS, 17.8, 45.9, 15.9),  # SLL
        "sll_me": _row(_MCS, 18.2, 48.1, 16.0),  # SLL-ME
        "sll_sle": _row(_MCS, 18.8, 50.8, 16.6),  # SLL-SLE (ours)
    },
}

#: Table 4 (MSCOCO, no attention): (row kind, decoding) -> CIDEr in %, Div-1, Div-2, mBLEU-4.
TABLE4: dict[tuple[str, str], Row] = {
    ("xe", "rs"): _row(_T4, 74.2, 0.57, 0.78, 0.06),
    ("sll", "rs"): _row(_T4, 114.6, 0.25, 0.32, 0.81),
    ("sll_me", "rs"): _row(_T4, 115.1, 0.25, 0.33, 0.80),
    ("sll_sle", "rs"): _row(_T4, 115.9, 0.29, 0.40, 0.68),
    ("xe", "bs"): _row(_T4, 102.5, 0.27, 0.35, 0.80),
    ("sll", "bs"): _row(_T4, 115.0, 0.26, 0.35, 0.78),
    ("sll_me", "bs"): _row(_T4, 115.6, 0.26, 0.34, 0.79),
    ("sll_sle", "bs"): _row(_T4, 117.2, 0.27, 0.36, 0.76),
}

#: Table 4, the reference rows of other diverse-captioning methods.
TABLE4_REFERENCE: list[tuple[str, Row]] = [
    ("VAE [33] (bs)", _row(_T4, 100.0, None, None, None)),
    ("GAN [26] (rs)", _row(_T4, None, 0.41, 0.55, 0.51)),
    ("GAN [26] (bs)", _row(_T4, None, 0.34, 0.44, 0.70)),
]

#: Table 1 (the motivation): XE and SLL under random sampling, the same numbers as Table 4's rs rows.
TABLE1: dict[str, Row] = {
    "xe": _row(_T4, 74.2, 0.57, 0.78, 0.06),
    "sll": _row(_T4, 114.6, 0.25, 0.32, 0.81),
}

#: The text's row names (our row kinds).
LABELS: dict[str, str] = {"xe": "XE", "sll": "SLL", "sll_me": "SLL-ME", "sll_sle": "SLL-SLE"}

#: Differences between rows the text states, per table: (row kind, minus row kind, {metric:
#: difference}, where). Table 2 (no attention): sec. 5.2, "The improvement of SLL-SLE over
#: SLL-ME on all metrics (Meteor: 0.2, CIDEr: 1.8, SPICE: 0.2) is much larger than the
#: improvement of SLL-ME over SLL on all metrics (Meteor: 0.0, CIDEr: 0.6, SPICE: 0.1)";
#: Table 3: sec. 5.3, "SLL-SLE improves over SLL by 0.6 on Meteor, 2.7 on CIDEr and 0.6 on SPICE".
TEXT_GAINS: dict[int, list[tuple[str, str, Row, str]]] = {
    2: [("sll_sle", "sll_me", _row(_MCS, 0.2, 1.8, 0.2), "sec. 5.2"),
        ("sll_me", "sll", _row(_MCS, 0.0, 0.6, 0.1), "sec. 5.2")],
    3: [("sll_sle", "sll", _row(_MCS, 0.6, 2.7, 0.6), "sec. 5.3")],
}

#: Tables whose rows are printed under each other's name: table -> (row kind, row kind, what
#: the text says). Table 3: sec. 5.3 says SLL-ME is worse than SLL, and its stated SLL-SLE
#: gains over SLL are those over the printed SLL-ME row.
SWAPPED: dict[int, tuple[str, str, str]] = {
    3: ("sll", "sll_me", '"SLL-ME performs worse than SLL on all metrics" (sec. 5.3)'),
}
PRINTED: dict[int, dict[bool, dict[str, Row]]] = {2: TABLE2, 3: TABLE3}


def text_consistent(number: int) -> dict[bool, dict[str, Row]]:
    """Table ``number``'s rows with the text's assignment (:data:`SWAPPED` rows exchanged)."""
    table = PRINTED[number]
    if number not in SWAPPED:
        return table
    a, b, _ = SWAPPED[number]
    return {att: {**rows, a: rows[b], b: rows[a]} for att, rows in table.items()}


#: Table 3 with the text-consistent assignment: the printed SLL row is SLL-ME and vice versa.
TABLE3_TEXT = text_consistent(3)


def _mcs(row: Row) -> str:
    return " / ".join(f"{row[k]:.1f}" if k in row else "NA" for k in _MCS.split())


def gain_mismatches(table: dict[str, Row], number: int) -> list[tuple[str, str, str, float, float, str]]:
    """The differences the text states for Table ``number`` that ``table`` (row kind -> row)
    does not give: (row kind, minus row kind, metric, stated, table's, where), to 0.05."""
    out = []
    for better, worse, gains, where in TEXT_GAINS.get(number, []):
        for metric, stated in gains.items():
            got = round(table[better][metric] - table[worse][metric], 1)
            if abs(got - stated) > 0.05:
                out.append((better, worse, metric, stated, got, where))
    return out


def text_notes(number: int) -> list[str]:
    """Where the paper's text and its Table ``number`` (rows without attention) disagree, in words."""
    printed, text = PRINTED[number][False], text_consistent(number)[False]
    notes = []
    if number in SWAPPED:
        a, b, said = SWAPPED[number]
        gains = "".join(f' and "{LABELS[x]} improves over {LABELS[y]} by" {_mcs(row)} ({where}; the printed '
                        f"{LABELS[x]} minus the printed {LABELS[{a: b, b: a}.get(y, y)]} row)"
                        for x, y, row, where in TEXT_GAINS.get(number, []))
        notes.append(f"The paper's Table {number} prints {LABELS[a]} {_mcs(printed[a])} and {LABELS[b]} "
                     f"{_mcs(printed[b])} (M / C / S), but its text says {said}{gains}: the printed {LABELS[a]} "
                     f"and {LABELS[b]} rows are swapped. The paper numbers beside our rows "
                     f"follow the text ({LABELS[a]} {_mcs(text[a])}, {LABELS[b]} {_mcs(text[b])}); the rows "
                     "'as printed [paper]' show the table as printed.")
    metrics = {"M": "METEOR", "C": "CIDEr", "S": "SPICE"}
    notes += [f"The paper's text ({where}) gives {LABELS[x]} over {LABELS[y]} {metrics[metric]} {stated:+.1f}; its "
              f"Table {number} gives {text[x][metric]:.1f} - {text[y][metric]:.1f} = {got:+.1f} (the table's numbers "
              "are shown)." for x, y, metric, stated, got, where in gain_mismatches(text, number)]
    return notes


def printed_rows(number: int) -> list[tuple[str, Row]]:
    """The rows of Table ``number`` that the text assigns otherwise, as printed and named both ways."""
    if number not in SWAPPED:
        return []
    a, b, _ = SWAPPED[number]
    printed = PRINTED[number][False]
    return [(f"{LABELS[x]}, as printed ({LABELS[y]} by the text)", printed[x]) for x, y in ((a, b), (b, a))]
