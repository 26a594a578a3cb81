"""StoreProxy: a Store that hands every primitive to another one, to wrap in tests and tools
(count calls, make racers read together, inject faults) by overriding only what they watch.

It forwards the ``LeaseTakeover`` capability too; over a store without it, nobody is ever
found holding a lease, so a lease waits for its expiry as it would on that store.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..stores.base import Envelope, Fence, Lease, LeaseHolder, LeaseTakeover, Page, Store

__all__ = ["StoreProxy"]


class StoreProxy:
    """Delegates every primitive of the ``Store`` port to ``inner``."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.durable = inner.durable
        self.buckets = inner.buckets

    def bucket_of(self, record_id: str) -> int:
        """Delegate."""
        return self.inner.bucket_of(record_id)

    def create(self, envelope: Envelope) -> bool:
        """Delegate."""
        return self.inner.create(envelope)

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Delegate."""
        return self.inner.get(kind, record_id)

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Delegate."""
        return self.inner.compare_and_set(envelope, expected_version, fence=fence)

    def annotate(
        self, kind: str, record_id: str, note: str, *, expected_version: int | None = None
    ) -> Envelope | None:
        """Delegate."""
        return self.inner.annotate(kind, record_id, note, expected_version=expected_version)

    def delete(
        self, kind: str, record_id: str, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Delegate."""
        return self.inner.delete(kind, record_id, expected_version, fence=fence)

    def scan(
        self, kind: str, states: Sequence[str], *, label: str | None = None,
        updated_before_ms: int | None = None, bucket: int | None = None,
        cursor: str | None = None, limit: int = 100,
    ) -> Page:
        """Delegate."""
        return self.inner.scan(kind, states, label=label, updated_before_ms=updated_before_ms,
                               bucket=bucket, cursor=cursor, limit=limit)

    def scan_due(
        self, kind: str, *, due_before_ms: int, bucket: int | None = None,
        cursor: str | None = None, limit: int = 100,
    ) -> Page:
        """Delegate."""
        return self.inner.scan_due(kind, due_before_ms=due_before_ms, bucket=bucket, cursor=cursor,
                                   limit=limit)

    def count(
        self, kind: str, states: Sequence[str], *, label: str | None = None,
        updated_after_ms: int | None = None, updated_before_ms: int | None = None,
    ) -> int:
        """Delegate."""
        return self.inner.count(kind, states, label=label, updated_after_ms=updated_after_ms,
                                updated_before_ms=updated_before_ms)

    def acquire_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *, bucket: int = 0
    ) -> Lease | None:
        """Delegate."""
        return self.inner.acquire_lease(name, owner, token, now_ms, lease_ms, bucket=bucket)

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Delegate."""
        return self.inner.renew_lease(lease, now_ms, lease_ms)

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Delegate."""
        return self.inner.checkpoint_lease(lease, cursor, now_ms)

    def release_lease(self, lease: Lease) -> bool:
        """Delegate."""
        return self.inner.release_lease(lease)

    def lease_holder(self, name: str, *, bucket: int = 0) -> LeaseHolder | None:
        """Delegate (None when the wrapped store cannot tell)."""
        if not isinstance(self.inner, LeaseTakeover):
            return None
        return self.inner.lease_holder(name, bucket=bucket)

    def take_over_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
        expected_fence: int, bucket: int = 0,
    ) -> Lease | None:
        """Delegate (None when the wrapped store cannot take a lease over)."""
        if not isinstance(self.inner, LeaseTakeover):
            return None
        return self.inner.take_over_lease(name, owner, token, now_ms, lease_ms,
                                          expected_fence=expected_fence, bucket=bucket)

    def close(self) -> None:
        """The wrapped store is the caller's to close."""
