"""The features HDF5 file: writer (the layout is documented in :func:`open_writer`) and reader."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import h5py
import numpy as np
import torch

from caprl.errors import CaprlError
from caprl.io import atomic_hdf5

DATASETS = ("image_ids", "pooled", "regions")
REQUIRED_ATTRS = ("backbone", "grid", "dim", "n_regions")
CHUNK_BYTES = 1 << 16  # at most this many bytes per HDF5 chunk, but always whole rows (at least one)


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per chunk: whole rows, about :data:`CHUNK_BYTES` or one row if a row is larger.

    Training reads a random batch of rows, so a chunk much larger than a row would read
    (and decompress, were it compressed) rows nobody asked for: at COCO sizes a 36 x 2048
    row is 288 KiB, one row per chunk. Chunks are made equal so the last one is not padded.
    """
    rows = max(1, min(n_rows, CHUNK_BYTES // max(1, row_bytes)))
    return -(-n_rows // -(-n_rows // rows)) if n_rows else 1


class FeatureWriter:
    """Fills the datasets of an open file row by row, in the order the rows arrive."""

    def __init__(self, h5: h5py.File, n_rows: int, dim: int, n_regions: int) -> None:
        self.n_rows, self.dim, self.n_regions = n_rows, dim, n_regions
        self.rows_written = 0
        chunked = n_rows > 0
        self._ids = h5.create_dataset("image_ids", shape=(n_rows,), dtype="int64", track_times=False)
        self._pooled = h5.create_dataset(
            "pooled", shape=(n_rows, dim), dtype="float32", track_times=False,
            chunks=(chunk_rows(n_rows, 4 * dim), dim) if chunked else None,
        )
        self._regions = h5.create_dataset(
            "regions", shape=(n_rows, n_regions, dim), dtype="float32", track_times=False,
            chunks=(chunk_rows(n_rows, 4 * n_regions * dim), n_regions, dim) if chunked else None,
        )

    def write(self, image_ids: Sequence[int] | np.ndarray, pooled: Any, regions: Any) -> None:
        """Append ``len(image_ids)`` rows (arrays or tensors of shape [b, D] and [b, R, D])."""
        ids = np.asarray(image_ids, dtype=np.int64)
        pooled_np = np.asarray(pooled, dtype=np.float32)
        regions_np = np.asarray(regions, dtype=np.float32)
        b = len(ids)
        if pooled_np.shape != (b, self.dim) or regions_np.shape != (b, self.n_regions, self.dim):
            raise ValueError(
                f"expected pooled {(b, self.dim)} and regions {(b, self.n_regions, self.dim)}, "
                f"got {pooled_np.shape} and {regions_np.shape}"
            )
        start, stop = self.rows_written, self.rows_written + b
        if stop > self.n_rows:
            raise ValueError(f"writing rows {start}:{stop} of a file sized for {self.n_rows}")
        self._ids[start:stop] = ids
        self._pooled[start:stop] = pooled_np
        self._regions[start:stop] = regions_np
        self.rows_written = stop


@contextlib.contextmanager
def open_writer(
    path: str | os.PathLike[str], n_rows: int, dim: int, n_regions: int, attrs: Mapping[str, Any]
) -> Iterator[FeatureWriter]:
    """Write a features file atomically: the file appears at ``path`` only if every row was written.

    Layout (shard files and the merged file alike)::

        image_ids  int64   [N]         annotation image id of each row
        pooled     float32 [N, D]      one vector per image
        regions    float32 [N, R, D]   R = grid*grid region vectors, row-major over the grid
        attrs:
          backbone         str   registry name (caprl.features.backbones.BACKBONES, or bottomup)
          grid             int   regions form a grid x grid map
          dim              int   D
          n_regions        int   R
          backbone_config  str   JSON of the settings that change the features
          dataset          str   dataset name from the annotations (optional)
          shard, n_shards  int   shard files only: this is shard ``shard`` of ``n_shards``

    The merged file has its rows sorted by ``image_ids`` ascending; a shard file lists its
    images in the order they were extracted (also ascending, see caprl.features.extract).
    Chunks hold whole rows (see :func:`chunk_rows`), so reading a batch of images reads
    little else.
    """
    missing = [a for a in REQUIRED_ATTRS if a not in attrs]
    if missing:
        raise ValueError(f"features attrs lack {missing}")
    with atomic_hdf5(path) as h5:  # a full disk: a clear error, no half-closed file (caprl.io)
        for key, value in attrs.items():
            h5.attrs[key] = value
        writer = FeatureWriter(h5, n_rows, dim, n_regions)
        yield writer
        if writer.rows_written != n_rows:
            raise RuntimeError(f"{path}: wrote {writer.rows_written} of {n_rows} rows")


def write_features(
    path: str | os.PathLike[str], image_ids: Sequence[int] | np.ndarray, pooled: Any, regions: Any,
    attrs: Mapping[str, Any],
) -> None:
    """Write in-memory arrays as one features file (layout: :func:`open_writer`)."""
    regions_np = np.asarray(regions, dtype=np.float32)
    _, n_regions, dim = regions_np.shape
    with open_writer(path, len(image_ids), dim, n_regions, attrs) as writer:
        writer.write(image_ids, pooled, regions_np)


def check_file(h5: h5py.File, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validate the layout of an open features file; return its attrs as plain Python values."""
    hint = "re-create it with caprl features / caprl merge-features"
    for name in DATASETS:
        if name not in h5:
            raise CaprlError(f"{path}: not a caprl features file (no dataset '{name}'); {hint}")
    attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in h5.attrs.items()}
    missing = [a for a in REQUIRED_ATTRS if a not in attrs]
    if missing:
        raise CaprlError(f"{path}: features file lacks attribute(s) {', '.join(missing)}; {hint}")
    n = h5["image_ids"].shape[0]
    want = {"pooled": (n, attrs["dim"]), "regions": (n, attrs["n_regions"], attrs["dim"])}
    for name, shape in want.items():
        if tuple(h5[name].shape) != shape:
            raise CaprlError(f"{path}: dataset '{name}' has shape {h5[name].shape}, expected {shape}; {hint}")
    return attrs


def open_features_file(path: str | os.PathLike[str]) -> h5py.File:
    """Open a features file for reading, with a CaprlError naming it when it is missing or unreadable."""
    p = Path(path)
    if not p.exists():
        raise CaprlError(f"features file not found: {p}; run caprl features / caprl merge-features first")
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise CaprlError(f"{p}: not a readable HDF5 file ({exc}); delete it and re-create it") from exc


class Features:
    """Read a features file: image id -> (pooled, regions) tensors.

    ``in_memory=True`` reads both datasets once (fine for small sets); ``in_memory=False``
    keeps the file open and reads only the rows asked for, through an LRU cache of at most
    ``cache_bytes`` (so the memory of a process does not grow with the dataset; the handle
    is reopened after pickling, e.g. in DataLoader workers)::

        with Features("data/synthetic/features/patches.h5") as feats:
            pooled, regions = feats.get([9, 3, 7])   # [3, D], [3, R, D]

    Reads are serialised by a lock, so a prefetch thread and the main thread may share it.
    """

    def __init__(self, path: str | os.PathLike[str], in_memory: bool = True, cache_bytes: int = 0) -> None:
        self.path = Path(path)
        self.in_memory = in_memory
        self._lock = threading.Lock()
        self._h5: h5py.File | None = open_features_file(self.path)
        self.attrs = check_file(self._h5, self.path)
        self.image_ids: np.ndarray = self._h5["image_ids"][:]
        self._row = {int(i): r for r, i in enumerate(self.image_ids)}
        if len(self._row) != len(self.image_ids):
            raise CaprlError(f"{self.path}: duplicate image ids; re-create it with caprl merge-features")
        self._pooled: np.ndarray | None = None
        self._regions: np.ndarray | None = None
        row_bytes = 4 * self.dim * (1 + self.n_regions)
        self._cache = RowCache(max(0, cache_bytes) // row_bytes)
        if in_memory:
            self._pooled = self._h5["pooled"][:]
            self._regions = self._h5["regions"][:]
            self.close()

    @property
    def backbone(self) -> str:
        return str(self.attrs["backbone"])

    @property
    def grid(self) -> int:
        return int(self.attrs["grid"])

    @property
    def dim(self) -> int:
        return int(self.attrs["dim"])

    @property
    def n_regions(self) -> int:
        return int(self.attrs["n_regions"])

    def __len__(self) -> int:
        return len(self.image_ids)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._row

    def rows(self, image_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Row numbers of ``image_ids``; a CaprlError names the first id not in the file."""
        try:
            return np.fromiter((self._row[int(i)] for i in image_ids), dtype=np.int64, count=len(image_ids))
        except KeyError as exc:
            raise CaprlError(
                f"{self.path}: no features for image id {exc.args[0]}; the features were extracted from "
                "other annotations: re-run caprl features and caprl merge-features"
            ) from None

    def get(self, image_ids: Sequence[int] | np.ndarray, regions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pooled [B, D], regions [B, R, D])`` float32 tensors, in the order of ``image_ids``.

        ``regions=False``: the regions are not read (``[B, 0, D]``): for models that read only
        the pooled vector (Show-Tell, LSTM3), whose batches would otherwise carry R times more
        bytes than they use from disk to the device.
        """
        rows = self.rows(image_ids)
        if not regions:
            return self._pooled_only(rows), torch.empty((len(rows), 0, self.dim), dtype=torch.float32)
        if self._pooled is not None and self._regions is not None:
            pooled, regions_ = self._pooled[rows], self._regions[rows]
            return torch.from_numpy(np.ascontiguousarray(pooled)), torch.from_numpy(np.ascontiguousarray(regions_))
        pooled = np.empty((len(rows), self.dim), np.float32)
        regions = np.empty((len(rows), self.n_regions, self.dim), np.float32)
        with self._lock:
            found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            for row in {int(r) for r in rows}:
                hit = self._cache.get(row)
                if hit is not None:
                    found[row] = hit
            missing = sorted({int(r) for r in rows} - found.keys())
            if missing:
                # row by row, in file order: h5py's list indexing is ~30x slower for these batches
                h5 = self._file()
                pooled_ds, regions_ds = h5["pooled"], h5["regions"]
                for row in missing:
                    found[row] = (pooled_ds[row], regions_ds[row])
                    self._cache.put(row, found[row])
            for k, row in enumerate(rows):
                pooled[k], regions[k] = found[int(row)]
        return torch.from_numpy(pooled), torch.from_numpy(regions)

    def _pooled_only(self, rows: np.ndarray) -> torch.Tensor:
        """The pooled rows alone: from memory, else the cache, else the file (each missing row
        once, in file order, as :meth:`get`); the regions dataset is never opened."""
        if self._pooled is not None:
            return torch.from_numpy(np.ascontiguousarray(self._pooled[rows]))
        with self._lock:
            found = {row: hit[0] for row in {int(r) for r in rows} if (hit := self._cache.get(row)) is not None}
            missing = sorted({int(r) for r in rows} - found.keys())
            if missing:
                pooled_ds = self._file()["pooled"]
                found.update((row, pooled_ds[row]) for row in missing)
        pooled = np.empty((len(rows), self.dim), np.float32)
        for k, row in enumerate(rows):
            pooled[k] = found[int(row)]
        return torch.from_numpy(pooled)

    def _file(self) -> h5py.File:
        if self._h5 is None:
            self._h5 = open_features_file(self.path)
        return self._h5

    def close(self) -> None:
        """Close the file handle (in-memory readers close it right after loading)."""
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None

    def __enter__(self) -> "Features":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_h5"] = None
        state["_lock"] = None
        state["_cache"] = RowCache(self._cache.capacity)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class RowCache:
    """Least-recently-used rows, at most ``capacity`` of them (0: no caching)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def keys(self) -> set[int]:
        return set(self._rows)

    def get(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        hit = self._rows.get(row)
        if hit is not None:
            self._rows.move_to_end(row)
        return hit

    def put(self, row: int, value: tuple[np.ndarray, np.ndarray]) -> None:
        if self.capacity <= 0:
            return
        self._rows[row] = value
        self._rows.move_to_end(row)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)
