"""The storage port: eight atomic primitives over opaque envelopes (SPEC §6, DESIGN §3).

A store moves envelopes (kind, id, version, state, updated_at_ms, JSON body) and leases; it
knows nothing of sagas, effects or approvals. Every rule about those lives above it, written
once. Time and random tokens are passed in by the caller; a store only compares them.

Contract shared by every implementation (the conformance suite in
``celery_sagas.testing.conformance`` checks it):

- ``create`` inserts only if the (kind, id) is absent.
- ``compare_and_set`` writes only if the stored version equals ``expected_version`` and the new
  envelope's version is ``expected_version + 1``. Retrying a write that was already applied
  (same version, same body) reports success, so a driver-level retry is harmless.
- ``scan`` is served by an index on (kind, state, updated_at_ms, id): its cost follows the
  matching records, never every record kept. Pages are keyset-paged with an opaque cursor.
- Leases: at most one unexpired lease per name; every grant carries a fencing number strictly
  greater than any earlier grant of that name; the cursor survives release and expiry.
- A write passing ``fence`` is refused with ``FencedWriteRefused`` when a grant of that lease
  name newer than ``fence.number`` exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._values import MAX_SAFE_INTEGER, duration_ms, identifier, timestamp_ms, token
from ..errors import SagaValidationError

__all__ = [
    "MAX_SCAN_LIMIT",
    "Envelope",
    "Fence",
    "Lease",
    "Page",
    "Store",
    "check_cursor",
    "check_envelope",
    "check_expected_version",
    "check_fence",
    "check_key",
    "check_kind",
    "check_lease_args",
    "check_lease_name",
    "check_lease_times",
    "check_scan_args",
]

MAX_SCAN_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Envelope:
    """One stored record as the store sees it: routing fields plus an opaque JSON body."""

    kind: str
    id: str
    version: int
    state: str
    updated_at_ms: int
    body: str


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan and the cursor of the next page (``None`` when done)."""

    items: tuple[Envelope, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease; ``fence`` strictly increases with every grant of the name."""

    name: str
    owner: str
    token: str = field(repr=False)
    expires_at_ms: int
    fence: int
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """Marks a write as made under grant ``number`` of lease ``lease``."""

    lease: str
    number: int

    @classmethod
    def of(cls, lease: Lease) -> Fence:
        """The fence of a granted lease."""
        return cls(lease.name, lease.fence)


@runtime_checkable
class Store(Protocol):
    """Eight atomic primitives; each call is one atomic operation on the server."""

    durable: bool

    def create(self, envelope: Envelope) -> bool:
        """Atomically insert if (kind, id) is absent; False if it exists."""
        ...

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope or None."""
        ...

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Atomically replace the record if its version is ``expected_version``."""
        ...

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        updated_before_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Return up to ``limit`` records of ``kind`` in ``states`` (index-backed, keyset-paged)."""
        ...

    def acquire_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int
    ) -> Lease | None:
        """Atomically grant the lease unless an unexpired one exists; bumps the fence."""
        ...

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Atomically extend an unexpired lease held with the same owner and token."""
        ...

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Atomically save the scan cursor of an unexpired lease held with this token."""
        ...

    def release_lease(self, lease: Lease) -> bool:
        """Atomically free the lease if held with this owner and token; keeps the cursor."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


_KINDS_RE_FIELD = "record kind"


def check_kind(kind: object) -> str:
    """A record kind is a short lowercase identifier such as ``saga``."""
    value = identifier(kind, field=_KINDS_RE_FIELD)
    if not value.islower():
        raise SagaValidationError(f"record kind must be lowercase: {value!r}")
    return value


def check_key(kind: str, record_id: str) -> None:
    """Refuse a (kind, id) pair that is not safe to build keys or SQL from."""
    check_kind(kind)
    token(record_id, field="record id", max_len=255)


def check_envelope(envelope: Envelope) -> None:
    """Refuse an envelope whose routing fields are not safe to build keys or SQL from."""
    check_key(envelope.kind, envelope.id)
    token(envelope.state, field="record state", max_len=64)
    timestamp_ms(envelope.updated_at_ms, field="updated_at_ms")
    if isinstance(envelope.version, bool) or not isinstance(envelope.version, int):
        raise SagaValidationError("version must be an int")
    if envelope.version < 1:
        raise SagaValidationError(f"version must be positive, got {envelope.version}")
    if not isinstance(envelope.body, str):
        raise SagaValidationError("body must be JSON text")
    if not envelope.body.isascii():
        # A lone surrogate cannot be stored as UTF-8: refuse it here, not as a driver error.
        try:
            envelope.body.encode("utf-8")
        except UnicodeEncodeError:
            raise SagaValidationError("body must be valid UTF-8 text") from None


def check_expected_version(envelope: Envelope, expected_version: int) -> None:
    """Refuse a compare-and-set whose new version is not ``expected_version + 1``."""
    if type(expected_version) is not int or envelope.version != expected_version + 1:
        raise SagaValidationError("the new version must be expected_version + 1")


def check_lease_name(name: str) -> None:
    """Refuse a lease name that is not a token, or has braces (it names a Redis hash tag)."""
    token(name, field="lease name", max_len=128)
    if "{" in name or "}" in name:
        raise SagaValidationError(f"lease name cannot contain braces: {name[:40]!r}")


def check_fence(fence: Fence) -> None:
    """Refuse a fence whose lease name is not valid or whose number is not a safe int."""
    check_lease_name(fence.lease)
    if type(fence.number) is not int or not 0 <= fence.number <= MAX_SAFE_INTEGER:
        raise SagaValidationError(f"fence number must be a non-negative int: {fence.number!r}")


def check_scan_args(kind: str, states: Sequence[str], limit: int, updated_before_ms: int | None) -> None:
    """Refuse a scan limit outside 1..1000, an empty state list or unsafe names."""
    check_kind(kind)
    if isinstance(states, str) or not states:
        raise SagaValidationError("states must be a non-empty sequence of state names")
    for state in states:
        token(state, field="record state", max_len=64)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise SagaValidationError(f"limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    if updated_before_ms is not None:
        timestamp_ms(updated_before_ms, field="updated_before_ms")


def check_lease_args(name: str, owner: str, lease_token: str) -> None:
    """Refuse lease names, owners and tokens that are not tokens."""
    check_lease_name(name)
    token(owner, field="lease owner", max_len=255)
    token(lease_token, field="lease token", max_len=128)


def check_lease_times(now_ms: int, lease_ms: int) -> int:
    """Refuse a bad clock reading or lease duration; return the expiry ``now_ms + lease_ms``."""
    timestamp_ms(now_ms, field="now_ms")
    duration_ms(lease_ms, field="lease_ms")
    return timestamp_ms(now_ms + lease_ms, field="lease expiry")


def check_cursor(cursor: str | None) -> None:
    """Refuse a lease cursor that is neither a string nor None."""
    if cursor is not None and not isinstance(cursor, str):
        raise SagaValidationError("lease cursor must be a str or None")
