"""The shipped conformance suite's own plumbing: one store per test, however many threads."""

from __future__ import annotations

import threading
import time

from celery_sagas import MemoryStore
from celery_sagas.stores.base import Store
from celery_sagas.testing.conformance import THREADS, StoreConformance


class _SlowMaker(StoreConformance):
    """make_store does I/O (a connection, a schema): slow enough for threads to race it."""

    def __init__(self) -> None:
        self.made: list[Store] = []

    def make_store(self) -> Store:
        time.sleep(0.05)
        store = MemoryStore()
        self.made.append(store)
        return store


def test_racing_threads_of_one_test_share_the_one_store_make_store_returned() -> None:
    suite = _SlowMaker()
    barrier = threading.Barrier(THREADS)
    seen: list[Store] = []

    def use() -> None:
        barrier.wait()
        seen.append(suite._store())

    threads = [threading.Thread(target=use) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(suite.made) == 1
    assert len(seen) == THREADS and all(store is suite.made[0] for store in seen)
    suite.teardown_method(None)
    assert suite._store() is not suite.made[0]  # the next test gets a fresh one
