"""The storage port: atomic primitives over opaque envelopes (docs/design.md §4.1).

A store moves envelopes (kind, id, version, state, updated_at_ms, JSON body, and the optional
``label``, ``due_at_ms`` and ``notes``) and leases; it knows nothing of sagas or approvals.
Every rule about those lives above it, written once. Time and random tokens are passed in by
the caller; a store only compares them.

Contract shared by every implementation (the conformance suite in
``celery_sagas.testing.conformance`` checks it):

- ``create`` inserts only if the (kind, id) is absent.
- ``compare_and_set`` writes only if the stored version equals ``expected_version`` and the new
  envelope's version is ``expected_version + 1``; it clears the record's notes (the writer read
  them, or its version would be stale). Retrying a write that was already applied (same version,
  same body) reports success, so a driver-level retry is harmless.
- ``annotate`` appends a note and bumps the version without the caller reading the record, and
  returns the record as written; nothing else of the record changes (its indexes neither).
- ``scan``, ``scan_due`` and ``count`` are served by indexes on (kind, state, updated_at_ms, id),
  (kind, label, state, updated_at_ms, id) and (kind, due_at_ms, id): their cost follows the
  matching records, never every record kept. Pages are keyset-paged with an opaque cursor.
- Records live in ``buckets`` buckets (``bucket_of(id)``); scans can be limited to one bucket,
  and leases are per (name, bucket). At most one unexpired lease per (name, bucket); every grant
  carries a fencing number strictly greater than any earlier grant of it; the cursor survives
  release and expiry.
- A write passing ``fence`` must be to a record of ``fence.bucket``, and is refused with
  ``FencedWriteRefused`` when that bucket's lease ``fence.lease`` has a grant newer than
  ``fence.number``. The check happens inside the bucket written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from .._values import MAX_SAFE_INTEGER, duration_ms, identifier, timestamp_ms, token
from ..errors import SagaValidationError

__all__ = [
    "MAX_NOTES",
    "MAX_NOTE_BYTES",
    "MAX_SCAN_LIMIT",
    "ORDER_KEYS",
    "CountSnapshot",
    "Envelope",
    "Fence",
    "IdIndexing",
    "Lease",
    "LeaseHolder",
    "LeaseTakeover",
    "Notifying",
    "OrderKey",
    "OrderedScan",
    "Page",
    "PrefixScan",
    "StateListing",
    "Store",
    "check_bucket",
    "check_count_args",
    "check_cursor",
    "check_envelope",
    "check_expected_version",
    "check_fence",
    "check_key",
    "check_kind",
    "check_lease_args",
    "check_lease_name",
    "check_lease_takeover_args",
    "check_lease_times",
    "check_note",
    "check_prefix_scan_args",
    "check_scan_args",
    "check_state",
    "delete_all",
    "prefix_end",
]

MAX_SCAN_LIMIT = 1000
OrderKey = Literal["updated", "created"]  # what ``OrderedScan.scan_ordered`` sorts by
ORDER_KEYS: tuple[OrderKey, ...] = ("updated", "created")
MAX_NOTES = 1000  # notes a record holds before a compare-and-set absorbs them
MAX_NOTE_BYTES = 2 * 1024 * 1024

# States are short names (``running``, ``manual-review``); no ':' so index keys stay unambiguous.
_STATE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One stored record as the store sees it: routing fields plus an opaque JSON body.

    ``label`` is a secondary index key fixed at create (a saga's definition name); while
    ``due_at_ms`` is set the record is in the due index; ``notes`` are the short texts appended
    by ``annotate`` since the last compare-and-set, oldest first.
    """

    kind: str
    id: str
    version: int
    state: str
    updated_at_ms: int
    body: str
    label: str | None = None
    due_at_ms: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan and the cursor of the next page (``None`` when done)."""

    items: tuple[Envelope, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease of one bucket; ``fence`` strictly increases with every grant of it."""

    name: str
    owner: str
    token: str = field(repr=False)
    expires_at_ms: int
    fence: int
    cursor: str | None = None
    bucket: int = 0


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a bucket's lease (never its token): owner, fencing number and expiry."""

    owner: str
    fence: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Fence:
    """Marks a write as made under grant ``number`` of lease ``lease`` of ``bucket``."""

    lease: str
    number: int
    bucket: int = 0

    @classmethod
    def of(cls, lease: Lease) -> Fence:
        """The fence of a granted lease."""
        return cls(lease.name, lease.fence, lease.bucket)


@runtime_checkable
class Store(Protocol):
    """Atomic primitives; each call is one atomic operation on the server."""

    @property
    def buckets(self) -> int:
        """How many buckets records, scans and leases are split into (1 or more)."""
        ...

    @property
    def durable(self) -> bool:
        """Whether what the store acknowledged survives a restart of its server (False for the
        memory store, and once a server was found to lose acknowledged writes)."""
        ...

    def bucket_of(self, record_id: str) -> int:
        """The bucket a record id lives in (0..buckets-1), the same in every process."""
        ...

    def create(self, envelope: Envelope) -> bool:
        """Atomically insert if (kind, id) is absent; False if it exists."""
        ...

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope (with its notes) or None."""
        ...

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Atomically replace the record if its version is ``expected_version``; clears notes."""
        ...

    def annotate(
        self, kind: str, record_id: str, note: str, *, expected_version: int | None = None
    ) -> Envelope | None:
        """Atomically append ``note`` and bump the version (only at ``expected_version`` when
        given); state, body and ``updated_at_ms`` stay. The envelope as written, or None when
        the record is absent, at another version, or already holds ``MAX_NOTES`` notes."""
        ...

    def delete(
        self, kind: str, record_id: str, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Atomically remove the record and its index entries if its version matches."""
        ...

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        label: str | None = None,
        updated_before_ms: int | None = None,
        bucket: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``), state by state,
        oldest first, in every bucket or one (index-backed, keyset-paged)."""
        ...

    def scan_due(
        self,
        kind: str,
        *,
        due_before_ms: int,
        bucket: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Up to ``limit`` records of ``kind`` whose ``due_at_ms`` is before ``due_before_ms``,
        earliest first (index-backed, keyset-paged)."""
        ...

    def count(
        self,
        kind: str,
        states: Sequence[str],
        *,
        label: str | None = None,
        updated_after_ms: int | None = None,
        updated_before_ms: int | None = None,
    ) -> int:
        """How many records of ``kind`` in ``states`` (and ``label``) were updated in
        [``updated_after_ms``, ``updated_before_ms``), counted from the indexes."""
        ...

    def acquire_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *, bucket: int = 0
    ) -> Lease | None:
        """Atomically grant the lease of ``bucket`` unless an unexpired one exists; bumps its
        fence."""
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


@runtime_checkable
class StateListing(Protocol):
    """An optional store capability: list the states records of a kind are in, so the sweep
    can report records whose state no scan asks for (docs/design.md §5). The SQL and memory
    stores have it; on Redis a state edited by hand is found through its index entry."""

    def stored_states(self, kind: str) -> list[str]:
        """The distinct states of the records of ``kind``, from an index (never every record)."""
        ...


@runtime_checkable
class Notifying(Protocol):
    """An optional store capability: tell listeners that a saga settled, so an async
    ``wait`` wakes at once instead of polling (docs/async.md). Redis publishes on a channel,
    PostgreSQL sends a NOTIFY; a store that cannot notify lacks the method."""

    def notify_settled(self, record_id: str) -> None:
        """Publish ``record_id`` on the store's settle channel; best effort, never raises."""
        ...


@runtime_checkable
class LeaseTakeover(Protocol):
    """An optional store capability: read who holds a lease, and take it over from that
    holder at once, before it expires (docs/design.md §5: the sweep lease of a process known
    to be gone, by the rule of step claims). The shipped stores have it; without it a lease
    whose holder died waits for its expiry."""

    def lease_holder(self, name: str, *, bucket: int = 0) -> LeaseHolder | None:
        """The holder of the lease of ``bucket`` (expired or not), or None when nobody holds
        it (never granted, or released)."""
        ...

    def take_over_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
        expected_fence: int, bucket: int = 0,
    ) -> Lease | None:
        """Atomically grant the lease of ``bucket`` to ``owner`` (fence bumped, cursor kept),
        expired or not, but only while its newest grant is still ``expected_fence``; None
        otherwise (another grant came first, or the lease was never granted)."""
        ...


@runtime_checkable
class PrefixScan(Protocol):
    """An optional store capability: the records of a kind whose id starts with a prefix, in
    id order, from an index on the ids (its cost follows the ids with that prefix, never every
    record). Every built-in store has it: SQL and memory from the primary key, Redis from an id
    index per bucket that ``create`` and ``delete`` maintain (records written before it
    existed are added by ``IdIndexing.index_ids``, ``celery sagas reindex``)."""

    def scan_prefix(
        self,
        kind: str,
        prefix: str,
        states: Sequence[str],
        *,
        label: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``) whose id starts
        with ``prefix``, by id, from the id the opaque ``cursor`` names."""
        ...


@runtime_checkable
class OrderedScan(Protocol):
    """An optional store capability: the records of a kind in several states as one list by
    (``updated_at_ms``, id), oldest or newest first, across states and buckets, merged from the
    state (or label) indexes: a page reads at most ``limit + 1`` entries of each index merged,
    never every record. Every built-in store has it; the web UI's sort uses it.

    ``by="created"`` orders by creation time instead: the ``updated_at_ms`` of the envelope
    ``create`` stored, which later writes never change (the ``Envelope`` carries no such field:
    the store keeps an index of it). Callers pass ``by`` only for ``"created"``, so a store
    written before it still serves the sort by last write."""

    def scan_ordered(
        self,
        kind: str,
        states: Sequence[str],
        *,
        label: str | None = None,
        updated_before_ms: int | None = None,
        newest_first: bool = False,
        cursor: str | None = None,
        limit: int = 100,
        by: OrderKey = "updated",
    ) -> Page:
        """Up to ``limit`` records of ``kind`` in ``states`` (and ``label``, and last written
        before ``updated_before_ms``) by (updated_at_ms, id), or by (creation time, id) with
        ``by="created"``, from the opaque ``cursor`` on."""
        ...


@runtime_checkable
class CountSnapshot(Protocol):
    """An optional store capability: the records of a kind per state, in all and per label,
    counted together from one snapshot (SQL: one statement; memory: under its lock; Redis: one
    MULTI/EXEC, or one pipeline on Redis Cluster, whose buckets span nodes). The web UI's
    overview uses it so its figures agree with each other while sagas move."""

    def count_snapshot(self, kind: str, states: Sequence[str], labels: Sequence[str]
                       ) -> dict[tuple[str, str | None], int]:
        """Per (state, None) every record of ``kind`` in that state; per (state, label) those
        of each of ``labels``."""
        ...


@runtime_checkable
class IdIndexing(Protocol):
    """An optional store capability: add records written before the store kept an id index
    or a creation index to them (Redis: both; SQL: fills ``created_at_ms`` on rows inserted
    before the column; memory lacks the method). Such a record counts as created at its last
    write: its true creation time was never stored."""

    def index_ids(self, kind: str, states: Sequence[str]) -> int:
        """Index the records of ``kind`` in ``states``; how many were added."""
        ...


def check_prefix_scan_args(kind: str, prefix: object, states: Sequence[str], limit: int,
                           cursor: object, label: str | None) -> list[str]:
    """The states of a valid ``scan_prefix`` call (SagaValidationError otherwise)."""
    wanted = check_scan_args(kind, states, limit, None, label)
    if not isinstance(prefix, str) or not prefix or len(prefix) > 128 or not prefix.isascii() \
            or not prefix.isprintable():
        raise SagaValidationError("an id prefix is 1..128 printable ASCII characters")
    if cursor is not None and (not isinstance(cursor, str) or not cursor.startswith(prefix)):
        raise SagaValidationError("malformed prefix scan cursor")
    return wanted


def prefix_end(prefix: str) -> str:
    """The smallest string above every id starting with ``prefix`` (ids are printable ASCII,
    so bumping the last character is enough)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def check_kind(kind: object) -> str:
    """A record kind is a short lowercase identifier such as ``saga``."""
    value = identifier(kind, field="record kind")
    if not value.islower():
        raise SagaValidationError(f"record kind must be lowercase: {value!r}")
    return value


def check_key(kind: str, record_id: str) -> None:
    """Refuse a (kind, id) pair that is not safe to build keys or SQL from."""
    check_kind(kind)
    token(record_id, field="record id", max_len=255)


def check_state(state: object) -> str:
    """A record state: 1..64 letters, digits, ``_``, ``.`` or ``-``."""
    if not isinstance(state, str) or not _STATE.fullmatch(state):
        raise SagaValidationError(f"record state must be 1..64 of [A-Za-z0-9_.-]: {str(state)[:40]!r}")
    return state


def check_bucket(bucket: object, buckets: int) -> int:
    """A bucket number in 0..buckets-1."""
    if isinstance(bucket, bool) or not isinstance(bucket, int) or not 0 <= bucket < buckets:
        raise SagaValidationError(f"bucket must be an int in 0..{buckets - 1}, got {bucket!r}")
    return bucket


def check_note(note: object) -> str:
    """A note: one line of UTF-8 text, at most ``MAX_NOTE_BYTES``."""
    if not isinstance(note, str) or not note or "\n" in note:
        raise SagaValidationError("a note must be a non-empty str without newlines")
    try:
        size = len(note.encode("utf-8"))
    except UnicodeEncodeError:
        raise SagaValidationError("a note must be valid UTF-8 text") from None
    if size > MAX_NOTE_BYTES:
        raise SagaValidationError(f"a note is {size} bytes, over {MAX_NOTE_BYTES}")
    return note


def check_envelope(envelope: Envelope) -> None:
    """Refuse an envelope whose routing fields are not safe to build keys or SQL from."""
    check_key(envelope.kind, envelope.id)
    check_state(envelope.state)
    timestamp_ms(envelope.updated_at_ms, field="updated_at_ms")
    if isinstance(envelope.version, bool) or not isinstance(envelope.version, int):
        raise SagaValidationError("version must be an int")
    if not 1 <= envelope.version <= MAX_SAFE_INTEGER:
        raise SagaValidationError(f"version must be in 1..2**53-1, got {envelope.version}")
    if not isinstance(envelope.body, str):
        raise SagaValidationError("body must be JSON text")
    if not envelope.body.isascii():
        # A lone surrogate cannot be stored as UTF-8: refuse it here, not as a driver error.
        try:
            envelope.body.encode("utf-8")
        except UnicodeEncodeError:
            raise SagaValidationError("body must be valid UTF-8 text") from None
    if envelope.label is not None:
        token(envelope.label, field="record label", max_len=128)
    if envelope.due_at_ms is not None:
        timestamp_ms(envelope.due_at_ms, field="due_at_ms")
    if envelope.notes:
        raise SagaValidationError("notes are appended by annotate, never written")


def check_expected_version(envelope: Envelope, expected_version: int) -> None:
    """Refuse a compare-and-set whose new version is not ``expected_version + 1``."""
    if type(expected_version) is not int or envelope.version != expected_version + 1:
        raise SagaValidationError("the new version must be expected_version + 1")


def check_lease_name(name: str) -> None:
    """Refuse a lease name that is not a token, or has braces (Redis hash tags)."""
    token(name, field="lease name", max_len=128)
    if "{" in name or "}" in name:
        raise SagaValidationError(f"lease name cannot contain braces: {name[:40]!r}")


def check_fence(fence: Fence, buckets: int) -> None:
    """Refuse a fence whose lease name, number or bucket is not valid."""
    if not isinstance(fence, Fence):
        raise SagaValidationError(f"expected a Fence, got {type(fence).__name__}")
    check_lease_name(fence.lease)
    if type(fence.number) is not int or not 0 <= fence.number <= MAX_SAFE_INTEGER:
        raise SagaValidationError(f"fence number must be a non-negative int: {fence.number!r}")
    check_bucket(fence.bucket, buckets)


def check_fenced_bucket(fence: Fence | None, record_bucket: int) -> None:
    """A fence guards the writes of its own bucket only."""
    if fence is not None and fence.bucket != record_bucket:
        raise SagaValidationError(
            f"a fence of bucket {fence.bucket} cannot guard a record of bucket {record_bucket}"
        )


def check_scan_args(
    kind: str, states: Sequence[str], limit: int, updated_before_ms: int | None,
    label: str | None = None,
) -> list[str]:
    """Refuse a scan limit outside 1..1000, an empty state list or unsafe names; return the
    states in order with repeats dropped."""
    check_kind(kind)
    if isinstance(states, str) or not states:
        raise SagaValidationError("states must be a non-empty sequence of state names")
    for state in states:
        check_state(state)
    check_limit(limit)
    if updated_before_ms is not None:
        timestamp_ms(updated_before_ms, field="updated_before_ms")
    if label is not None:
        token(label, field="record label", max_len=128)
    return list(dict.fromkeys(states))


def check_limit(limit: object) -> int:
    """A page size in 1..MAX_SCAN_LIMIT."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise SagaValidationError(f"limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    return limit


def check_count_args(
    kind: str, states: Sequence[str], label: str | None, after_ms: int | None, before_ms: int | None
) -> list[str]:
    """Refuse bad count arguments; return the states with repeats dropped."""
    names = check_scan_args(kind, states, 1, before_ms, label)
    if after_ms is not None:
        timestamp_ms(after_ms, field="updated_after_ms")
    return names


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


def check_lease_takeover_args(name: str, owner: str, lease_token: str,
                              expected_fence: object) -> int:
    """Refuse a takeover's names and tokens as ``check_lease_args`` does, and a fencing number
    that no grant can have (grants are numbered from 1); return the fence."""
    check_lease_args(name, owner, lease_token)
    if type(expected_fence) is not int or not 1 <= expected_fence <= MAX_SAFE_INTEGER:
        raise SagaValidationError(f"expected_fence must be an int in 1..2**53-1: {expected_fence!r}")
    return expected_fence


def check_cursor(cursor: str | None) -> None:
    """Refuse a lease cursor that is neither a string nor None."""
    if cursor is not None and not isinstance(cursor, str):
        raise SagaValidationError("lease cursor must be a str or None")


def delete_all(
    store: Store, items: Sequence[tuple[str, str, int]], *, fence: Fence | None = None
) -> list[bool]:
    """Delete each (kind, id, expected version) as ``delete`` would, in order; whether each was
    deleted. A store with a ``delete_many`` of the same signature (SQL: one transaction, one
    commit) does the whole batch at once; any other store is called once per item."""
    batch = getattr(store, "delete_many", None)
    if callable(batch):
        return list(batch(items, fence=fence))
    return [store.delete(kind, record_id, version, fence=fence) for kind, record_id, version in items]
