"""The Stack-Captioning paper's published numbers (Gu et al., AAAI 2018), typed in as data.

All are percentages on the MSCOCO Karpathy test split. Keys of a row are the table
columns (B@1..B@4, M = METEOR, R = ROUGE-L, C = CIDEr, S = SPICE); a metric the paper
does not report is absent. Rows of Tables 1-2 are keyed by our model name (params.yaml ``models:``).
"""

from __future__ import annotations

Row = dict[str, float]


def _row(columns: str, *values: float | None) -> Row:
    return {c: v for c, v in zip(columns.split(), values) if v is not None}


_T12 = "B@1 B@2 B@3 B@4 M C"
_T3 = "B@1 B@2 B@3 B@4 M R C S"

#: Table 1: the models trained with cross-entropy (XE), beam search K = 5.
TABLE1: dict[str, Row] = {
    "fc_lstm": _row(_T12, 72.1, 54.8, 39.6, 28.5, 24.3, 91.4),  # LSTM (XE)
    "lstm3": _row(_T12, 70.5, 53.1, 38.9, 28.3, 23.2, 85.7),  # LSTM3 layers (XE)
    "softatt": _row(_T12, 73.8, 57.2, 43.1, 33.0, 25.7, 101.0),  # LSTM+Att_Soft (XE)
    "topdown": _row(_T12, 74.9, 58.6, 44.5, 33.3, 25.8, 103.4),  # LSTM+Att_Top-Down (XE)
    "stackcap_star": _row(_T12, 75.6, 59.6, 45.6, 34.6, 26.3, 108.0),  # Stack-Cap* (XE)
    "stackcap": _row(_T12, 76.2, 60.4, 46.4, 35.2, 26.5, 109.1),  # Stack-Cap (XE)
}

#: Table 2: after RL — SCST (CIDEr) for the one-stage models, C2F for the Stack-Cap models.
TABLE2: dict[str, Row] = {
    "fc_lstm": _row(_T12, 76.7, 58.3, 42.8, 30.8, 25.5, 100.2),  # LSTM (CIDEr)
    "lstm3": _row(_T12, 73.0, 56.1, 41.1, 29.9, 25.1, 95.9),  # LSTM3 layers (CIDEr)
    "softatt": _row(_T12, 77.3, 59.3, 44.1, 32.1, 25.9, 104.8),  # LSTM+Att_Soft (CIDEr)
    "topdown": _row(_T12, 76.7, 60.4, 45.6, 33.9, 26.5, 112.7),  # LSTM+Att_Top-Down (CIDEr)
    "stackcap_star": _row(_T12, 77.9, 61.6, 46.7, 35.0, 26.9, 115.9),  # Stack-Cap* (C2F)
    "stackcap": _row(_T12, 78.6, 62.5, 47.9, 36.1, 27.4, 120.4),  # Stack-Cap (C2F)
}

#: Table 3: prior methods as the paper reports them ("—" in the paper = absent here).
TABLE3_PRIOR: list[tuple[str, Row]] = [
    ("Google NIC (Vinyals et al. 2015)", _row(_T3, None, None, None, 27.7, None, 23.7, 85.5, None)),
    ("Hard-Attention (Xu et al. 2015)", _row(_T3, 70.7, 49.2, 34.4, 24.3, 23.9, None, None, None)),
    ("Soft-Attention (Xu et al. 2015)", _row(_T3, 71.8, 50.4, 35.7, 25.0, 23.0, None, None, None)),
    ("VAE (Pu et al. 2016)", _row(_T3, 72.0, 52.0, 37.0, 28.0, 24.0, None, 90.0, None)),
    ("Google NICv2 (Vinyals et al. 2016)", _row(_T3, None, None, None, 32.1, 25.7, None, 99.8, None)),
    ("Attributes-CNN+RNN (Wu et al. 2016)", _row(_T3, 74.0, 56.0, 42.0, 31.0, 26.0, None, 94.0, None)),
    ("CNNL+RHN (Gu et al. 2017a)", _row(_T3, 72.3, 55.3, 41.3, 30.6, 25.2, None, 98.9, 18.3)),
    ("PG-SPIDEr-TAG (Liu et al. 2017c)", _row(_T3, 75.4, 59.1, 44.5, 33.2, 25.7, 55.0, 101.3, None)),
    ("Adaptive (Lu et al. 2017)", _row(_T3, 74.2, 58.0, 43.9, 33.2, 26.6, None, 108.5, None)),
    ("SCST:Att2in (Rennie et al. 2017)", _row(_T3, None, None, None, 33.3, 26.3, 55.3, 111.4, None)),
    ("SCST:Att2in (Ens. 4) (Rennie et al. 2017)", _row(_T3, None, None, None, 34.8, 26.9, 56.3, 115.2, None)),
]

#: Table 3, last row: Stack-Cap (C2F), with ROUGE-L and SPICE.
TABLE3_STACKCAP: Row = _row(_T3, 78.6, 62.5, 47.9, 36.1, 27.4, 56.9, 120.4, 20.9)
