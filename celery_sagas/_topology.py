"""Where a saga's records live: the store's buckets, and the fence of the sweep at work
(docs/design.md §4.2).

What a saga owns (its child sagas, its approvals) is given an id in the saga's own bucket, so
one fenced sweep of a bucket covers a saga and all it owns. A sweep working on a bucket sets
its fence for this thread (``fenced``); every write this thread then makes to a saga of that
bucket carries it (``fence_for``).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

from .stores.base import Fence, Store

__all__ = ["Topology"]


class Topology:
    """The buckets of one store, and the fence this thread writes under."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._ambient = threading.local()  # the fence of the sweep this thread works under

    def colocated(self, saga_id: str, candidate: str) -> str:
        """``candidate``, or ``candidate.1``, ``candidate.2``... the first that falls in the
        bucket of ``saga_id``: a deterministic id of a record the saga owns (a child saga)."""
        store = self._store
        home, found, n = store.bucket_of(saga_id), candidate, 0
        while store.bucket_of(found) != home:
            n += 1
            found = f"{candidate}.{n}"
        return found

    def colocated_id(self, saga_id: str) -> str:
        """A fresh id drawn until it falls in the saga's bucket: what a saga owns lives in its
        slot (docs/design.md §4.2). Expected draws: the store's bucket count."""
        store = self._store
        home = store.bucket_of(saga_id)
        while True:
            candidate = uuid.uuid4().hex
            if store.bucket_of(candidate) == home:
                return candidate

    @contextlib.contextmanager
    def fenced(self, fence: Fence | None) -> Iterator[None]:
        """Within this block, writes this thread makes to sagas of ``fence``'s bucket carry it
        (a sweep acting on a parent also moves its children, which live in its bucket)."""
        previous = getattr(self._ambient, "fence", None)
        self._ambient.fence = fence if fence is not None else previous
        try:
            yield
        finally:
            self._ambient.fence = previous

    def fence_for(self, saga_id: str) -> Fence | None:
        """The fence a write to ``saga_id`` carries now: the sweep's, in its bucket only."""
        fence: Fence | None = getattr(self._ambient, "fence", None)
        if fence is None or self._store.bucket_of(saga_id) != fence.bucket:
            return None
        return fence
