"""Race helpers: real threads released together, and a store that makes racers read together.

``race(call, threads)`` runs ``call(i)`` in ``threads`` threads started on one barrier and
returns each result or raised exception. ``ReadTogether`` wraps a store so that each thread's
first ``get`` waits until every racer has read: all of them judge the same version before any
writes, so a test of "exactly one wins" cannot pass just because threads ran in turn::

    racing = ReadTogether(store, parties=16)
    results = race(lambda i: consume(racing, clock, approval_id, ...), threads=16)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..stores.base import Envelope, Store
from .proxy import StoreProxy

__all__ = ["DEFAULT_THREADS", "ReadTogether", "race"]

DEFAULT_THREADS = 16
JOIN_TIMEOUT_S = 60.0


def race(call: Callable[[int], object], threads: int = DEFAULT_THREADS) -> list[object]:
    """Run ``call(i)`` for i in 0..threads-1 on threads released by one barrier."""
    barrier = threading.Barrier(threads)
    results: list[object] = [None] * threads

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call(i)
        except Exception as exc:
            results[i] = exc

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(JOIN_TIMEOUT_S)
        if worker.is_alive():
            raise AssertionError(f"a racing thread did not finish within {JOIN_TIMEOUT_S} s")
    return results


class ReadTogether(StoreProxy):
    """A ``Store`` whose first ``get`` in each thread waits until ``parties`` threads have read."""

    def __init__(self, store: Store, parties: int = DEFAULT_THREADS) -> None:
        super().__init__(store)
        self._barrier = threading.Barrier(parties, timeout=JOIN_TIMEOUT_S)
        self._seen = threading.local()

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Read, then (first read of this thread only) wait for the other racers."""
        found = self.inner.get(kind, record_id)
        if not getattr(self._seen, "read", False):
            self._seen.read = True
            self._barrier.wait()
        return found
