"""Read the next batches in a background thread while the current step runs.

The order of the batches is fixed by the caller (a pure function of seed and epoch), so
reading ahead changes nothing but the time: the items come out in that order, each exactly
once. A thread (not a process) is enough: HDF5 reads and torch's kernels release the GIL,
and the batch holds only the rows this process asked for (under DDP, its shard).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_DONE = object()


class Prefetcher(Generic[K, V]):
    """Iterate ``(key, load(key))`` over ``keys``, with up to ``depth`` loads done ahead.

    ``depth=0`` loads in the caller's thread. An exception in ``load`` is raised by the
    iteration at that item. Leaving the ``with`` block early (a pre-empted job, an error)
    stops the thread after the load in flight::

        with Prefetcher(data.batch, batches, depth=2) as loaded:
            for ids, batch in loaded:
                step(batch)
    """

    def __init__(self, load: Callable[[K], V], keys: Sequence[K], depth: int = 2) -> None:
        self.load, self.keys, self.depth = load, list(keys), depth
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Prefetcher[K, V]":
        if self.depth > 0 and self.keys:
            self._thread = threading.Thread(target=self._work, name="caprl-prefetch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[K, V]]:
        if self._thread is None:
            for key in self.keys:
                yield key, self.load(key)
            return
        for key in self.keys:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield key, item

    def _work(self) -> None:
        for key in self.keys:
            if self._stop.is_set():
                break
            try:
                item: Any = self.load(key)
            except BaseException as error:  # handed to the consumer, raised there
                item = _Failure(error)
            if not self._put(item) or isinstance(item, _Failure):
                return
        self._put(_DONE)

    def _put(self, item: Any) -> bool:
        """Queue ``item``, waiting for room; False if the consumer left first."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error
