"""ValidatingStore: the one place the shipped stores check their arguments (docs/design.md §4.4).

Every public primitive of ``Store`` is defined here once: it refuses bad input with
``SagaValidationError`` (before anything is written or sent) and then calls the store's hook of
the same name with a leading underscore (``create`` -> ``_create``), which may trust its
arguments. A backend implements only the hooks, ``buckets``, ``bucket_of`` and ``close``.

The base holds no state and adds one method call per primitive; it is an implementation aid,
not the plugin interface: a third-party store implements the ``Store`` protocol however it
likes (subclassing this base is one way, and the conformance suite holds both to the same
contract).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from .._values import timestamp_ms
from ..errors import SagaValidationError
from ._cursor import decode_position
from .base import (
    ORDER_KEYS,
    Envelope,
    Fence,
    Lease,
    LeaseHolder,
    OrderKey,
    Page,
    check_bucket,
    check_count_args,
    check_cursor,
    check_envelope,
    check_expected_version,
    check_fence,
    check_fenced_bucket,
    check_key,
    check_kind,
    check_lease_args,
    check_lease_name,
    check_lease_takeover_args,
    check_lease_times,
    check_limit,
    check_note,
    check_prefix_scan_args,
    check_scan_args,
)

__all__ = [
    "ValidatingCountSnapshot",
    "ValidatingLeaseTakeover",
    "ValidatingOrderedScan",
    "ValidatingPrefixScan",
    "ValidatingScanStore",
    "ValidatingStateListing",
    "ValidatingStore",
]


class ValidatingStore(ABC):
    """Validates every primitive's arguments once, then calls the backend's hook."""

    @property
    @abstractmethod
    def buckets(self) -> int:
        """How many buckets records, scans and leases are split into."""

    @abstractmethod
    def bucket_of(self, record_id: str) -> int:
        """The bucket a record id lives in (0..buckets-1), the same in every process."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    # ------------------------------------------------------------------ records

    def create(self, envelope: Envelope) -> bool:
        """Atomically insert if (kind, id) is absent; False if it exists."""
        check_envelope(envelope)
        return self._create(envelope)

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope (with its notes) or None."""
        check_key(kind, record_id)
        return self._get(kind, record_id)

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        """Atomically replace the record if its version is ``expected_version``; clears notes.
        True also when the identical write was already applied (a retried call); raises
        ``FencedWriteRefused`` when ``fence`` is older than its bucket's newest grant."""
        check_envelope(envelope)
        check_expected_version(envelope, expected_version)
        if fence is not None:
            self._check_fence(fence, envelope.id)
        return self._compare_and_set(envelope, expected_version, fence)

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        """Atomically append ``note`` and bump the version (only at ``expected_version`` when
        given); the envelope as written, or None when the record is absent, at another
        version, or already holds ``MAX_NOTES`` notes."""
        check_key(kind, record_id)
        check_note(note)
        if expected_version is not None and type(expected_version) is not int:
            raise SagaValidationError("expected_version must be an int or None")
        return self._annotate(kind, record_id, note, expected_version)

    def delete(self, kind: str, record_id: str, expected_version: int, *,
               fence: Fence | None = None) -> bool:
        """Atomically remove the record and its index entries if its version matches."""
        self._check_delete(kind, record_id, expected_version, fence)
        return self._delete(kind, record_id, expected_version, fence)

    def delete_many(self, items: Sequence[tuple[str, str, int]], *,
                    fence: Fence | None = None) -> list[bool]:
        """``delete`` for each (kind, id, expected version) in order, every item checked before
        the first is deleted; whether each was deleted."""
        for kind, record_id, expected_version in items:
            self._check_delete(kind, record_id, expected_version, fence)
        return self._delete_many(items, fence)

    # ------------------------------------------------------------------ scans

    def scan(self, kind: str, states: Sequence[str], *, label: str | None = None,
             updated_before_ms: int | None = None, bucket: int | None = None,
             cursor: str | None = None, limit: int = 100) -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``), state by state in
        the order given, oldest first, in every bucket or one (index-backed, keyset-paged)."""
        wanted = check_scan_args(kind, states, limit, updated_before_ms, label)
        if bucket is not None:
            check_bucket(bucket, self.buckets)
        return self._scan(kind, wanted, label, updated_before_ms, bucket, cursor, limit)

    def scan_due(self, kind: str, *, due_before_ms: int, bucket: int | None = None,
                 cursor: str | None = None, limit: int = 100) -> Page:
        """Up to ``limit`` records of ``kind`` whose ``due_at_ms`` is before ``due_before_ms``,
        earliest first (index-backed, keyset-paged)."""
        check_kind(kind)
        timestamp_ms(due_before_ms, field="due_before_ms")
        check_limit(limit)
        if bucket is not None:
            check_bucket(bucket, self.buckets)
        return self._scan_due(kind, due_before_ms, bucket, cursor, limit)

    def count(self, kind: str, states: Sequence[str], *, label: str | None = None,
              updated_after_ms: int | None = None, updated_before_ms: int | None = None) -> int:
        """How many records of ``kind`` in ``states`` (and ``label``) were updated in
        [``updated_after_ms``, ``updated_before_ms``), counted from the indexes."""
        wanted = check_count_args(kind, states, label, updated_after_ms, updated_before_ms)
        return self._count(kind, wanted, label, updated_after_ms, updated_before_ms)

    # ------------------------------------------------------------------ leases

    def acquire_lease(self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
                      bucket: int = 0) -> Lease | None:
        """Atomically grant the lease of ``bucket`` unless an unexpired one exists; bumps its
        fence."""
        check_lease_args(name, owner, token)
        expires_at_ms = check_lease_times(now_ms, lease_ms)
        check_bucket(bucket, self.buckets)
        return self._acquire_lease(name, owner, token, now_ms, expires_at_ms, bucket)

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Atomically extend an unexpired lease held with the same owner and token."""
        self._check_lease(lease)
        return self._renew_lease(lease, now_ms, check_lease_times(now_ms, lease_ms))

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Atomically save the scan cursor of an unexpired lease held with this token."""
        self._check_lease(lease)
        check_cursor(cursor)
        timestamp_ms(now_ms, field="now_ms")
        return self._checkpoint_lease(lease, cursor, now_ms)

    def release_lease(self, lease: Lease) -> bool:
        """Atomically free the lease if held with this owner and token; keeps the cursor."""
        self._check_lease(lease)
        return self._release_lease(lease)

    # ------------------------------------------------------------------ checks

    def _check_fence(self, fence: Fence, record_id: str) -> None:
        check_fence(fence, self.buckets)
        check_fenced_bucket(fence, self.bucket_of(record_id))

    def _check_delete(self, kind: str, record_id: str, expected_version: int,
                      fence: Fence | None) -> None:
        check_key(kind, record_id)
        if type(expected_version) is not int:
            raise SagaValidationError("expected_version must be an int")
        if fence is not None:
            self._check_fence(fence, record_id)

    def _check_lease(self, lease: Lease) -> None:
        check_lease_args(lease.name, lease.owner, lease.token)
        check_bucket(lease.bucket, self.buckets)

    # ------------------------------------------------------------------ hooks (arguments checked)

    @abstractmethod
    def _create(self, envelope: Envelope) -> bool: ...

    @abstractmethod
    def _get(self, kind: str, record_id: str) -> Envelope | None: ...

    @abstractmethod
    def _compare_and_set(self, envelope: Envelope, expected_version: int,
                         fence: Fence | None) -> bool: ...

    @abstractmethod
    def _annotate(self, kind: str, record_id: str, note: str,
                  expected_version: int | None) -> Envelope | None: ...

    @abstractmethod
    def _delete(self, kind: str, record_id: str, expected_version: int,
                fence: Fence | None) -> bool: ...

    def _delete_many(self, items: Sequence[tuple[str, str, int]], fence: Fence | None) -> list[bool]:
        """One ``_delete`` per item; a store that can batch them overrides it."""
        return [self._delete(kind, record_id, version, fence) for kind, record_id, version in items]

    @abstractmethod
    def _scan(self, kind: str, states: list[str], label: str | None, updated_before_ms: int | None,
              bucket: int | None, cursor: str | None, limit: int) -> Page:
        """``states`` come without repeats; ``bucket`` is None or a valid bucket."""

    @abstractmethod
    def _scan_due(self, kind: str, due_before_ms: int, bucket: int | None, cursor: str | None,
                  limit: int) -> Page: ...

    @abstractmethod
    def _count(self, kind: str, states: list[str], label: str | None, updated_after_ms: int | None,
               updated_before_ms: int | None) -> int: ...

    @abstractmethod
    def _acquire_lease(self, name: str, owner: str, token: str, now_ms: int, expires_at_ms: int,
                       bucket: int) -> Lease | None:
        """``expires_at_ms`` is ``now_ms + lease_ms``, checked."""

    @abstractmethod
    def _renew_lease(self, lease: Lease, now_ms: int, expires_at_ms: int) -> Lease | None: ...

    @abstractmethod
    def _checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool: ...

    @abstractmethod
    def _release_lease(self, lease: Lease) -> bool: ...


class ValidatingStateListing(ABC):
    """The optional ``StateListing`` capability with its argument checked (a store that has
    it subclasses this beside ``ValidatingStore``)."""

    def stored_states(self, kind: str) -> list[str]:
        """The distinct states of the records of ``kind``, from an index (never every record)."""
        return self._stored_states(check_kind(kind))

    @abstractmethod
    def _stored_states(self, kind: str) -> list[str]: ...


class ValidatingPrefixScan(ABC):
    """The optional ``PrefixScan`` capability with its arguments checked (a store that has it
    subclasses this beside ``ValidatingStore``)."""

    def scan_prefix(self, kind: str, prefix: str, states: Sequence[str], *, label: str | None = None,
                    cursor: str | None = None, limit: int = 100) -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``) whose id starts
        with ``prefix``, by id, from the id the opaque ``cursor`` names."""
        wanted = check_prefix_scan_args(kind, prefix, states, limit, cursor, label)
        return self._scan_prefix(kind, prefix, wanted, label, cursor, limit)

    @abstractmethod
    def _scan_prefix(self, kind: str, prefix: str, states: list[str], label: str | None,
                     cursor: str | None, limit: int) -> Page:
        """``states`` come without repeats; ``cursor``, when given, starts with ``prefix``."""


class ValidatingLeaseTakeover(ABC):
    """The optional ``LeaseTakeover`` capability with its arguments checked (a store that has
    it subclasses this beside ``ValidatingStore``)."""

    @property
    @abstractmethod
    def buckets(self) -> int:
        """How many buckets leases are split into."""

    def lease_holder(self, name: str, *, bucket: int = 0) -> LeaseHolder | None:
        """The holder of the lease of ``bucket`` (expired or not), or None when nobody holds it."""
        check_lease_name(name)
        return self._lease_holder(name, check_bucket(bucket, self.buckets))

    def take_over_lease(self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
                        expected_fence: int, bucket: int = 0) -> Lease | None:
        """Atomically grant the lease of ``bucket`` (fence bumped, cursor kept) while its
        newest grant is still ``expected_fence``; None otherwise."""
        fence = check_lease_takeover_args(name, owner, token, expected_fence)
        expires_at_ms = check_lease_times(now_ms, lease_ms)
        check_bucket(bucket, self.buckets)
        return self._take_over_lease(name, owner, token, expires_at_ms, fence, bucket)

    @abstractmethod
    def _lease_holder(self, name: str, bucket: int) -> LeaseHolder | None: ...

    @abstractmethod
    def _take_over_lease(self, name: str, owner: str, token: str, expires_at_ms: int,
                         expected_fence: int, bucket: int) -> Lease | None:
        """``expires_at_ms`` is ``now_ms + lease_ms``, checked."""


class ValidatingOrderedScan(ABC):
    """The optional ``OrderedScan`` capability with its arguments checked (a store that has it
    subclasses this beside ``ValidatingStore``)."""

    def scan_ordered(self, kind: str, states: Sequence[str], *, label: str | None = None,
                     updated_before_ms: int | None = None, newest_first: bool = False,
                     cursor: str | None = None, limit: int = 100,
                     by: OrderKey = "updated") -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``, and last written
        before ``updated_before_ms``) by (updated_at_ms, id), or by (creation time, id) with
        ``by="created"``, from the opaque ``cursor`` on."""
        wanted = check_scan_args(kind, states, limit, updated_before_ms, label)
        if not isinstance(newest_first, bool):
            raise SagaValidationError("newest_first must be a bool")
        if by not in ORDER_KEYS:
            raise SagaValidationError(f"by must be one of {', '.join(ORDER_KEYS)}, got {by!r}")
        scan = self._scan_created if by == "created" else self._scan_ordered
        return scan(kind, wanted, label, updated_before_ms, newest_first,
                    decode_position(cursor, by), limit)

    @abstractmethod
    def _scan_ordered(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """``states`` come without repeats; ``at`` is the first position of the page, if any."""

    @abstractmethod
    def _scan_created(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """As ``_scan_ordered``, by (creation time, id); ``at`` is such a position."""


class ValidatingCountSnapshot(ABC):
    """The optional ``CountSnapshot`` capability with its arguments checked (a store that has
    it subclasses this beside ``ValidatingStore``)."""

    def count_snapshot(self, kind: str, states: Sequence[str], labels: Sequence[str]
                       ) -> dict[tuple[str, str | None], int]:
        """Per (state, None) every record of ``kind`` in that state; per (state, label) those
        of each of ``labels``, counted from one snapshot."""
        wanted = check_scan_args(kind, states, 1, None)
        if isinstance(labels, str):
            raise SagaValidationError("labels must be a sequence of labels")
        named = list(dict.fromkeys(labels))
        for label in named:
            check_scan_args(kind, wanted, 1, None, label)
        return self._count_snapshot(kind, wanted, named)

    @abstractmethod
    def _count_snapshot(self, kind: str, states: list[str], labels: list[str]
                        ) -> dict[tuple[str, str | None], int]:
        """``states`` and ``labels`` come checked, without repeats."""


class ValidatingScanStore(ValidatingStore, ValidatingPrefixScan, ValidatingLeaseTakeover,
                          ValidatingOrderedScan, ValidatingCountSnapshot):
    """``ValidatingStore`` with the optional capabilities every shipped store has (prefix,
    ordered and snapshot scans, lease takeover); state listing stays a mixin of its own."""
