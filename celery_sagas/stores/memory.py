"""MemoryStore: the reference store, thread-safe, non-durable (tests and the embedded demo)."""

from __future__ import annotations

import bisect
import hmac
import threading
from collections.abc import Sequence
from dataclasses import replace

from .._values import timestamp_ms
from ..errors import FencedWriteRefused
from ._cursor import decode_cursor, encode_cursor
from .base import (
    Envelope,
    Fence,
    Lease,
    Page,
    check_cursor,
    check_envelope,
    check_expected_version,
    check_fence,
    check_key,
    check_lease_args,
    check_lease_times,
    check_scan_args,
)

__all__ = ["MemoryStore"]

_IndexKey = tuple[str, str]  # (kind, state)
_Position = tuple[int, str]  # (updated_at_ms, id)


class MemoryStore:
    """Keeps every record in process memory behind one lock; loses everything on exit."""

    durable = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], Envelope] = {}
        self._index: dict[_IndexKey, list[_Position]] = {}
        self._leases: dict[str, Lease] = {}
        self._fences: dict[str, int] = {}
        self._cursors: dict[str, str | None] = {}

    def create(self, envelope: Envelope) -> bool:
        """Insert if (kind, id) is absent; False if it exists."""
        check_envelope(envelope)
        with self._lock:
            key = (envelope.kind, envelope.id)
            if key in self._records:
                return False
            self._put(envelope)
            return True

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope or None."""
        check_key(kind, record_id)
        with self._lock:
            return self._records.get((kind, record_id))

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Replace the record if its stored version is ``expected_version``."""
        check_envelope(envelope)
        check_expected_version(envelope, expected_version)
        if fence is not None:
            check_fence(fence)
        with self._lock:
            if fence is not None and self._fences.get(fence.lease, 0) > fence.number:
                raise FencedWriteRefused(lease=fence.lease, fence=fence.number)
            current = self._records.get((envelope.kind, envelope.id))
            if current is None:
                return False
            if current.version != expected_version:
                return current == envelope
            self._unindex(current)
            self._put(envelope)
            return True

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        updated_before_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Walk the (kind, state) indexes in the order given, oldest first."""
        check_scan_args(kind, states, limit, updated_before_ms)
        states = list(dict.fromkeys(states))  # a state named twice is walked once
        start_state, after, _ = decode_cursor(cursor, states)
        items: list[Envelope] = []
        last: _Position = (0, "")
        last_state = states[0]
        with self._lock:
            for state in states[start_state:]:
                positions = self._index.get((kind, state), [])
                begin = bisect.bisect_right(positions, after) if after else 0
                for position in positions[begin:]:
                    if updated_before_ms is not None and position[0] >= updated_before_ms:
                        break
                    if len(items) == limit:
                        # The cursor names the state of the last item returned, not the state
                        # being walked: that position means nothing in another state's index.
                        return Page(tuple(items), encode_cursor(states, last_state, last))
                    items.append(self._records[(kind, position[1])])
                    last, last_state = position, state
                after = None
        return Page(tuple(items), None)

    def acquire_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int
    ) -> Lease | None:
        """Grant the lease unless an unexpired one exists."""
        check_lease_args(name, owner, token)
        expires_at_ms = check_lease_times(now_ms, lease_ms)
        with self._lock:
            held = self._leases.get(name)
            if held is not None and held.expires_at_ms > now_ms:
                return None
            fence = self._fences.get(name, 0) + 1
            self._fences[name] = fence
            lease = Lease(name, owner, token, expires_at_ms, fence, self._cursors.get(name))
            self._leases[name] = lease
            return lease

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Extend an unexpired lease held with this owner and token."""
        check_lease_args(lease.name, lease.owner, lease.token)
        expires_at_ms = check_lease_times(now_ms, lease_ms)
        with self._lock:
            held = self._held(lease, now_ms)
            if held is None:
                return None
            renewed = replace(held, expires_at_ms=expires_at_ms)
            self._leases[lease.name] = renewed
            return renewed

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Save the cursor of an unexpired lease held with this owner and token."""
        check_lease_args(lease.name, lease.owner, lease.token)
        check_cursor(cursor)
        timestamp_ms(now_ms, field="now_ms")
        with self._lock:
            held = self._held(lease, now_ms)
            if held is None:
                return False
            self._cursors[lease.name] = cursor
            self._leases[lease.name] = replace(held, cursor=cursor)
            return True

    def release_lease(self, lease: Lease) -> bool:
        """Free the lease if held with this owner and token; the cursor stays."""
        check_lease_args(lease.name, lease.owner, lease.token)
        with self._lock:
            held = self._leases.get(lease.name)
            if held is None or not _same_holder(held, lease):
                return False
            del self._leases[lease.name]
            return True

    def close(self) -> None:
        """Nothing to release."""

    def _held(self, lease: Lease, now_ms: int) -> Lease | None:
        held = self._leases.get(lease.name)
        if held is None or held.expires_at_ms <= now_ms or not _same_holder(held, lease):
            return None
        return held

    def _put(self, envelope: Envelope) -> None:
        self._records[(envelope.kind, envelope.id)] = envelope
        positions = self._index.setdefault((envelope.kind, envelope.state), [])
        bisect.insort(positions, (envelope.updated_at_ms, envelope.id))

    def _unindex(self, envelope: Envelope) -> None:
        positions = self._index[(envelope.kind, envelope.state)]
        del positions[bisect.bisect_left(positions, (envelope.updated_at_ms, envelope.id))]


def _same_holder(held: Lease, lease: Lease) -> bool:
    return held.owner == lease.owner and hmac.compare_digest(held.token, lease.token)
