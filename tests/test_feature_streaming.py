"""Features stream from disk: same rows as in memory, a bounded cache, read-ahead in order.

Real HDF5 files written by caprl's own writer; a real training run from disk and one in
memory must end with identical weights.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from caprl.data.loader import Loading
from caprl.data.prefetch import Prefetcher
from caprl.data.feature_store import CHUNK_BYTES, Features, chunk_rows, write_features

ATTRS = {"backbone": "patches", "grid": 2, "dim": 6, "n_regions": 4}


@pytest.fixture
def features_file(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(100, 160) * 3
    pooled = rng.random((len(ids), 6), dtype=np.float32)
    regions = rng.random((len(ids), 4, 6), dtype=np.float32)
    path = tmp_path / "features.h5"
    write_features(path, ids, pooled, regions, ATTRS)
    return path, ids, pooled, regions


@pytest.mark.parametrize("cache_rows", [0, 3, 1000])
def test_streamed_rows_equal_the_in_memory_rows(features_file: Any, cache_rows: int) -> None:
    path, ids, pooled, regions = features_file
    row_bytes = 4 * 6 * (1 + 4)
    memory = Features(path, in_memory=True)
    stream = Features(path, in_memory=False, cache_bytes=cache_rows * row_bytes)
    rng = np.random.default_rng(1)
    for _ in range(20):  # random batches, repeats and unsorted ids included
        batch = rng.choice(ids, size=int(rng.integers(1, 12)), replace=True).tolist()
        for (a, b) in zip(stream.get(batch), memory.get(batch)):
            assert torch.equal(a, b)
        assert len(stream._cache) <= cache_rows
    k = int(np.flatnonzero(ids == batch[0])[0])
    assert np.array_equal(stream.get([batch[0]])[1][0].numpy(), regions[k])
    stream.close()


def test_cache_serves_repeats_without_reading_the_file(features_file: Any) -> None:
    path, ids, _, _ = features_file
    stream = Features(path, in_memory=False, cache_bytes=10 * 4 * 6 * 5)
    first = stream.get(ids[:5].tolist())
    stream.close()  # the handle is gone: only the cache can answer
    stream._h5 = None
    stream.path = path.with_name("moved.h5")
    again = stream.get(ids[:5].tolist()[::-1])
    assert torch.equal(again[1], first[1].flip(0))


def test_chunks_hold_whole_rows_near_the_target_size() -> None:
    coco_row = 4 * 36 * 2048  # 288 KiB: one row per chunk
    assert chunk_rows(123_287, coco_row) == 1
    small = 4 * 16 * 48
    rows = chunk_rows(10_000, small)
    assert 1 < rows and rows * small <= CHUNK_BYTES
    assert chunk_rows(7, small) <= 7


def test_written_file_uses_the_row_chunks(features_file: Any) -> None:
    path, ids, _, _ = features_file
    with h5py.File(path, "r") as h5:
        chunks = h5["regions"].chunks
    assert chunks[1:] == (4, 6) and chunks[0] == chunk_rows(len(ids), 4 * 4 * 6)


def test_loading_auto_keeps_small_files_in_memory(features_file: Any) -> None:
    path = str(features_file[0])
    assert Loading(in_memory="auto", in_memory_max_mib=1).keep_in_memory(path)
    assert not Loading(in_memory="auto", in_memory_max_mib=0).keep_in_memory(path)
    assert not Loading(in_memory=False).keep_in_memory(path)


def test_prefetcher_yields_every_item_in_order() -> None:
    keys = list(range(25))
    for depth in (0, 1, 3):
        with Prefetcher(lambda k: k * k, keys, depth=depth) as loaded:
            assert list(loaded) == [(k, k * k) for k in keys]


def test_prefetcher_reads_ahead_in_a_background_thread() -> None:
    threads: list[str] = []

    def load(key: int) -> int:
        threads.append(threading.current_thread().name)
        return key

    with Prefetcher(load, [1, 2, 3], depth=2) as loaded:
        next(iter(loaded))
        time.sleep(0.2)
        assert len(threads) == 3  # the rest were read while the first was in use
    assert set(threads) == {"caprl-prefetch"}


def test_prefetcher_raises_a_load_error_at_its_item() -> None:
    def load(key: int) -> int:
        if key == 2:
            raise ValueError("broken row 2")
        return key

    got = []
    with pytest.raises(ValueError, match="broken row 2"):
        with Prefetcher(load, [0, 1, 2, 3], depth=2) as loaded:
            for key, _ in loaded:
                got.append(key)
    assert got == [0, 1]


def test_leaving_early_stops_the_thread() -> None:
    prefetcher = Prefetcher(lambda k: k, list(range(1000)), depth=2)
    with prefetcher as loaded:
        for key, _ in loaded:
            if key == 3:
                break
    assert prefetcher._thread is None and not any(t.name == "caprl-prefetch" and t.is_alive()
                                                   for t in threading.enumerate())


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import os

    from conftest import TINY, default_params, merge
    from pipeline_data import build_dataset

    work = tmp_path_factory.mktemp("streaming")
    params = merge(default_params(), TINY)
    params["synthetic"]["n_train"] = 40
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    return build_dataset(work, params, env=env)


@pytest.mark.parametrize("run", ["topdown-xe", "fc-scst"])
def test_training_from_disk_equals_training_in_memory(tiny_dataset: Any, tmp_path: Path, run: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from caprl import params as params_mod
    from caprl.models import checkpoint
    from caprl.data.loader import CaptionData, DataPaths
    from caprl.training import run as run_mod

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tiny_dataset.workdir)
    params = params_mod.load(tiny_dataset.params)
    params["runs"] = {run: {"method": run.split("-")[1], "model": run.split("-")[0], "options": {"epochs": 1}}}
    paths = DataPaths(*(str(getattr(tiny_dataset, k)) for k in ("annotations", "vocab", "labels", "features")))
    results = []
    for mode, loading in (("memory", Loading(in_memory=True, prefetch=0)),
                          ("disk", Loading(in_memory=False, cache_mib=0, prefetch=2))):
        params["loading"] = {**params["loading"], "prefetch": loading.prefetch}
        data = CaptionData(paths, loading)
        assert data.features.in_memory is (mode == "memory")
        best, position = run_mod.train(params, "synthetic", run, data, str(tiny_dataset.cider_df), {}, tmp_path / mode)
        results.append((checkpoint.load(best).module("model").state, [{k: v for k, v in h.items() if k != "seconds"}
                                                                       for h in position.history]))
    (memory_state, memory_history), (disk_state, disk_history) = results
    assert memory_history == disk_history
    assert all(torch.equal(memory_state[k], disk_state[k]) for k in memory_state)


@pytest.mark.parametrize("in_memory,cache_rows", [(True, 0), (False, 0), (False, 1000)])
def test_pooled_only_reads_equal_the_pooled_rows_and_skip_the_regions(features_file: Any, in_memory: bool,
                                                                      cache_rows: int) -> None:
    path, ids, pooled, _ = features_file
    feats = Features(path, in_memory=in_memory, cache_bytes=cache_rows * 4 * 6 * 5)
    batch = [int(ids[7]), int(ids[2]), int(ids[7]), int(ids[40])]
    full = feats.get(batch)  # fills the cache when there is one
    alone, none = feats.get(batch + [int(ids[50])], regions=False)  # cache hits and a miss
    assert torch.equal(alone[:4], full[0]) and tuple(none.shape) == (5, 0, 6)
    assert np.array_equal(alone[4].numpy(), pooled[50])
    if not in_memory:  # the regions dataset is never opened: a file without one still serves the pooled rows
        feats.close()
        feats._h5 = None
        stripped = path.with_name("pooled_only.h5")
        with h5py.File(path, "r") as src, h5py.File(stripped, "w") as dst:
            for key in src:
                if key != "regions":
                    src.copy(key, dst)
        feats.path = stripped
        assert torch.equal(feats.get(batch[:2] + [int(ids[51])], regions=False)[0][2], torch.from_numpy(pooled[51]))
    feats.close()


@pytest.mark.parametrize("arch,regions", [("fc", 0), ("lstm3", 0), ("topdown", 3)])
def test_the_trainer_reads_regions_only_for_models_that_use_them(tmp_path: Path, arch: str, regions: int) -> None:
    """Show-Tell and LSTM3 read the pooled vector alone: their batches carry no regions (R times
    fewer bytes from disk to the device); attention models get them."""
    from caprl.models import build_model
    from caprl.objectives import ObjectiveEnv, build_objective
    from toy import CONSTANT_LR, FEAT, WORDS, decode, toy_trainer

    sizes = {"embed_size": 8, "hidden_size": 16, "dropout": 0.0}
    model = build_model(arch, {**sizes, "att_hidden_size": 8} if arch == "topdown" else sizes, len(WORDS), FEAT, 3)
    env = ObjectiveEnv(decode_words=decode, reward=lambda name: None, max_length=6)
    trainer = toy_trainer(build_objective("xe", {"lr": 1e-2, "epochs": 1, **CONSTANT_LR}, env, model), model, tmp_path)
    for ids, (batch, _) in trainer.batches([[0, 1, 2], [3, 4]]):
        assert tuple(batch.regions.shape) == (len(ids), regions, FEAT)
        trainer.step(ids, (batch, 0))
