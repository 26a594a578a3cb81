"""MemoryStore: the reference store, thread-safe, non-durable (tests and the embedded demo).

Every primitive takes one lock, so each is atomic. Indexes are sorted lists of positions, one
per (kind, state), per (kind, label, state) and per kind for due times, each split by bucket
so that a scan of one bucket reads only its records.
"""

from __future__ import annotations

import bisect
import heapq
import hmac
import threading
import zlib

from .._frozen import replace
from ..errors import FencedWriteRefused, SagaValidationError
from ._cursor import decode_cursor, encode_cursor, encode_position
from ._validating import ValidatingScanStore, ValidatingStateListing
from .base import MAX_NOTES, Envelope, Fence, Lease, LeaseHolder, Page

__all__ = ["MemoryStore"]

_Position = tuple[int, str]  # (updated_at_ms or due_at_ms, id)
_LeaseKey = tuple[str, int]  # (name, bucket)


class MemoryStore(ValidatingScanStore, ValidatingStateListing):
    """Keeps every record in process memory behind one lock; loses everything on exit.

    Its arguments are checked by ``ValidatingStore`` (docs/design.md §4.4).
    """

    durable = False

    def __init__(self, *, buckets: int = 1) -> None:
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 1024:
            raise SagaValidationError(f"buckets must be an int in 1..1024, got {buckets!r}")
        self._bucket_count = buckets
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], Envelope] = {}
        self._index: dict[tuple[object, ...], list[_Position]] = {}
        self._born: dict[str, list[_Position]] = {}  # per kind: (created ms, id), sorted
        self._born_at: dict[tuple[str, str], int] = {}  # (kind, id): the create's updated_at_ms
        self._leases: dict[_LeaseKey, Lease] = {}
        self._fences: dict[_LeaseKey, int] = {}
        self._cursors: dict[_LeaseKey, str | None] = {}

    @property
    def buckets(self) -> int:
        """How many buckets scans and leases are split into (fixed at construction)."""
        return self._bucket_count

    def bucket_of(self, record_id: str) -> int:
        """CRC-32 of the id modulo the bucket count (as the Redis store)."""
        return zlib.crc32(record_id.encode("ascii")) % self.buckets

    # ------------------------------------------------------------------ records

    def _create(self, envelope: Envelope) -> bool:
        """Insert if (kind, id) is absent; False if it exists."""
        with self._lock:
            if (envelope.kind, envelope.id) in self._records:
                return False
            self._put(envelope)
            key = (envelope.kind, envelope.id)
            self._born_at[key] = envelope.updated_at_ms
            bisect.insort(self._born.setdefault(envelope.kind, []),
                          (envelope.updated_at_ms, envelope.id))
            return True

    def _get(self, kind: str, record_id: str) -> Envelope | None:
        """The stored envelope (with its notes) or None."""
        with self._lock:
            return self._records.get((kind, record_id))

    def _compare_and_set(self, envelope: Envelope, expected_version: int, fence: Fence | None) -> bool:
        """Replace the record if its stored version is ``expected_version``; clears notes."""
        with self._lock:
            self._refuse_fenced(fence)
            current = self._records.get((envelope.kind, envelope.id))
            if current is None:
                return False
            if current.version != expected_version:
                return current == envelope
            if current.label != envelope.label:
                return False
            self._drop(current)
            self._put(envelope)
            return True

    def _annotate(self, kind: str, record_id: str, note: str, expected_version: int | None
                  ) -> Envelope | None:
        """Append ``note`` and bump the version (only at ``expected_version`` when given)."""
        with self._lock:
            current = self._records.get((kind, record_id))
            if current is None or len(current.notes) >= MAX_NOTES:
                return None
            if expected_version is not None and current.version != expected_version:
                return None
            noted = replace(current, version=current.version + 1, notes=(*current.notes, note))
            self._records[(kind, record_id)] = noted  # same positions in every index
            return noted

    def _delete(self, kind: str, record_id: str, expected_version: int, fence: Fence | None) -> bool:
        """Remove the record and its index entries if its version matches."""
        with self._lock:
            self._refuse_fenced(fence)
            current = self._records.get((kind, record_id))
            if current is None or current.version != expected_version:
                return False
            self._drop(current)
            born = self._born[kind]
            del born[bisect.bisect_left(born, (self._born_at.pop((kind, record_id)), record_id))]
            return True

    # ------------------------------------------------------------------ scans

    def _scan(self, kind: str, states: list[str], label: str | None, updated_before_ms: int | None,
              bucket: int | None, cursor: str | None, limit: int) -> Page:
        """Walk the indexes state by state in the order given, bucket by bucket, oldest first."""
        first_state, after, (first_bucket,) = decode_cursor(cursor, states, extras=1)
        walk = self._buckets(bucket, first_bucket)
        items: list[Envelope] = []
        with self._lock:
            for index in range(first_state, len(states)):
                for at in walk if index == first_state else self._buckets(bucket, None):
                    resume = after if (index, at) == (first_state, walk[0]) else None
                    key = ("s", kind, states[index], label, at)
                    for position in self._after(key, resume, updated_before_ms):
                        if len(items) == limit:
                            return Page(tuple(items), encode_cursor(states, states[index], position, at))
                        items.append(self._records[(kind, position[1])])
        return Page(tuple(items), None)

    def _scan_due(self, kind: str, due_before_ms: int, bucket: int | None, cursor: str | None,
                  limit: int) -> Page:
        """Records whose due time is before ``due_before_ms``, bucket by bucket, earliest first."""
        _, after, (first_bucket,) = decode_cursor(cursor, ["due"], extras=1)
        walk = self._buckets(bucket, first_bucket)
        items: list[Envelope] = []
        with self._lock:
            for at in walk:
                resume = after if at == walk[0] else None
                for position in self._after(("d", kind, at), resume, due_before_ms):
                    if len(items) == limit:
                        return Page(tuple(items), encode_cursor(["due"], "due", position, at))
                    items.append(self._records[(kind, position[1])])
        return Page(tuple(items), None)

    def _count(self, kind: str, states: list[str], label: str | None, updated_after_ms: int | None,
               updated_before_ms: int | None) -> int:
        """Count the matching index entries of every bucket."""
        low = (updated_after_ms, "") if updated_after_ms is not None else None
        high = (updated_before_ms, "") if updated_before_ms is not None else None
        total = 0
        with self._lock:
            for state in states:
                for at in range(self.buckets):
                    positions = self._index.get(("s", kind, state, label, at), [])
                    start = bisect.bisect_left(positions, low) if low else 0
                    end = bisect.bisect_left(positions, high) if high else len(positions)
                    total += max(0, end - start)
        return total

    def _scan_prefix(self, kind: str, prefix: str, states: list[str], label: str | None,
                     cursor: str | None, limit: int) -> Page:
        """The matching records of every bucket, sorted by id (``PrefixScan``)."""
        wanted = set(states)
        start = cursor or prefix
        with self._lock:
            found = sorted(
                (e for (k, i), e in self._records.items()
                 if k == kind and i.startswith(prefix) and i >= start and e.state in wanted
                 and (label is None or e.label == label)),
                key=lambda e: e.id)[:limit + 1]
        following = found[limit].id if len(found) > limit else None
        return Page(tuple(found[:limit]), following)

    def _scan_ordered(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """Each (state, bucket) index's next ``limit + 1`` positions, merged (``OrderedScan``)."""
        runs = []
        with self._lock:
            for state in states:
                for bucket in range(self.buckets):
                    key = ("s", kind, state, label, bucket)
                    if not newest_first:
                        runs.append(self._after(key, at, before)[:limit + 1])
                        continue
                    run = self._after(key, None, before)
                    if at is not None:
                        run = run[:bisect.bisect_right(run, at)]
                    runs.append(run[-(limit + 1):][::-1])
            found = list(heapq.merge(*runs, reverse=newest_first))[:limit + 1]
            items = tuple(self._records[(kind, record_id)] for _, record_id in found[:limit])
        return Page(items, encode_position(found[limit]) if len(found) > limit else None)

    def _scan_created(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """The kind's creation index walked from ``at``, its records filtered (``OrderedScan``
        with ``by="created"``)."""
        wanted = set(states)
        with self._lock:
            born = self._born.get(kind, [])
            if newest_first:
                run = born[:bisect.bisect_right(born, at)] if at else born
                walk = iter(run[::-1])
            else:
                walk = iter(born[bisect.bisect_left(born, at):] if at else born)
            found: list[tuple[_Position, Envelope]] = []
            for position in walk:
                record = self._records[(kind, position[1])]
                if record.state in wanted and label in (None, record.label) and (
                        before is None or record.updated_at_ms < before):
                    found.append((position, record))
                    if len(found) > limit:
                        break
        following = encode_position(found[limit][0], "created") if len(found) > limit else None
        return Page(tuple(record for _, record in found[:limit]), following)

    def _count_snapshot(self, kind: str, states: list[str], labels: list[str]
                        ) -> dict[tuple[str, str | None], int]:
        """Every index's size, read under the lock (``CountSnapshot``)."""
        with self._lock:
            return {(state, label): sum(len(self._index.get(("s", kind, state, label, b), []))
                                        for b in range(self.buckets))
                    for state in states for label in (None, *labels)}

    def _stored_states(self, kind: str) -> list[str]:
        """The distinct states of the records of ``kind``, sorted (from the state indexes)."""
        with self._lock:
            return sorted({str(key[2]) for key, positions in self._index.items()
                           if key[:2] == ("s", kind) and positions})

    # ------------------------------------------------------------------ leases

    def _acquire_lease(self, name: str, owner: str, token: str, now_ms: int, expires_at_ms: int,
                       bucket: int) -> Lease | None:
        """Grant the lease of ``bucket`` unless an unexpired one exists."""
        key = (name, bucket)
        with self._lock:
            held = self._leases.get(key)
            if held is not None and held.expires_at_ms > now_ms:
                return None
            fence = self._fences.get(key, 0) + 1
            self._fences[key] = fence
            lease = Lease(name, owner, token, expires_at_ms, fence, self._cursors.get(key), bucket)
            self._leases[key] = lease
            return lease

    def _renew_lease(self, lease: Lease, now_ms: int, expires_at_ms: int) -> Lease | None:
        """Extend an unexpired lease held with this owner and token."""
        with self._lock:
            held = self._held(lease, now_ms)
            if held is None:
                return None
            renewed = replace(held, expires_at_ms=expires_at_ms)
            self._leases[(lease.name, lease.bucket)] = renewed
            return renewed

    def _checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Save the cursor of an unexpired lease held with this owner and token."""
        with self._lock:
            held = self._held(lease, now_ms)
            if held is None:
                return False
            key = (lease.name, lease.bucket)
            self._cursors[key] = cursor
            self._leases[key] = replace(held, cursor=cursor)
            return True

    def _release_lease(self, lease: Lease) -> bool:
        """Free the lease if held with this owner and token; the cursor stays."""
        with self._lock:
            key = (lease.name, lease.bucket)
            held = self._leases.get(key)
            if held is None or not _same_holder(held, lease):
                return False
            del self._leases[key]
            return True

    def _lease_holder(self, name: str, bucket: int) -> LeaseHolder | None:
        """The holder of the lease of ``bucket``, expired or not (``LeaseTakeover``)."""
        with self._lock:
            held = self._leases.get((name, bucket))
        return None if held is None else LeaseHolder(held.owner, held.fence, held.expires_at_ms)

    def _take_over_lease(self, name: str, owner: str, token: str, expires_at_ms: int,
                         expected_fence: int, bucket: int) -> Lease | None:
        """Grant the lease while its newest grant is ``expected_fence`` (``LeaseTakeover``)."""
        key = (name, bucket)
        with self._lock:
            if self._fences.get(key, 0) != expected_fence:
                return None
            self._fences[key] = expected_fence + 1
            lease = Lease(name, owner, token, expires_at_ms, expected_fence + 1,
                          self._cursors.get(key), bucket)
            self._leases[key] = lease
            return lease

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ internals

    def _buckets(self, bucket: int | None, start: int | None) -> list[int]:
        if bucket is not None:
            if start not in (None, 0, bucket):
                raise SagaValidationError("malformed scan cursor")
            return [bucket]
        first = start or 0
        if not 0 <= first < self.buckets:
            raise SagaValidationError("malformed scan cursor")
        return list(range(first, self.buckets))

    def _after(self, key: tuple[object, ...], start: _Position | None, before: int | None
               ) -> list[_Position]:
        """The positions of one index from ``start`` (inclusive: a cursor names the first
        position of the next page) up to ``before`` (exclusive)."""
        positions = self._index.get(key, [])
        begin = bisect.bisect_left(positions, start) if start else 0
        end = bisect.bisect_left(positions, (before, "")) if before is not None else len(positions)
        return positions[begin:end]

    def _keys(self, envelope: Envelope) -> list[tuple[tuple[object, ...], _Position]]:
        at = self.bucket_of(envelope.id)
        position = (envelope.updated_at_ms, envelope.id)
        keys: list[tuple[tuple[object, ...], _Position]] = [
            (("s", envelope.kind, envelope.state, None, at), position)
        ]
        if envelope.label is not None:
            keys.append((("s", envelope.kind, envelope.state, envelope.label, at), position))
        if envelope.due_at_ms is not None:
            keys.append((("d", envelope.kind, at), (envelope.due_at_ms, envelope.id)))
        return keys

    def _put(self, envelope: Envelope) -> None:
        self._records[(envelope.kind, envelope.id)] = envelope
        for key, position in self._keys(envelope):
            bisect.insort(self._index.setdefault(key, []), position)

    def _drop(self, envelope: Envelope) -> None:
        del self._records[(envelope.kind, envelope.id)]
        for key, position in self._keys(envelope):
            positions = self._index[key]
            del positions[bisect.bisect_left(positions, position)]

    def _refuse_fenced(self, fence: Fence | None) -> None:
        if fence is not None and self._fences.get((fence.lease, fence.bucket), 0) > fence.number:
            raise FencedWriteRefused(lease=fence.lease, fence=fence.number)

    def _held(self, lease: Lease, now_ms: int) -> Lease | None:
        held = self._leases.get((lease.name, lease.bucket))
        if held is None or held.expires_at_ms <= now_ms or not _same_holder(held, lease):
            return None
        return held


def _same_holder(held: Lease, lease: Lease) -> bool:
    return held.owner == lease.owner and hmac.compare_digest(held.token, lease.token)
