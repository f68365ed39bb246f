"""Data stages: synthetic dataset, Karpathy-format ingestion, vocabulary/labels, references.

Files flow as: Karpathy JSON (+ images) --prepare--> annotations JSON --vocab--> vocab.json +
labels HDF5; annotations JSON --references--> COCO-format references of one split.
"""

SPLITS: tuple[str, ...] = ("train", "val", "test")
