"""RedisStore: the production store, each mutating primitive one Lua script (SPEC §6).

Layout (``keys.py``): a record is a hash in bucket ``crc32(id) % buckets``; each (kind, state)
has one sorted set per bucket, scored by ``updated_at_ms``, in the record's hash tag, so the
scripts that write a record and its index touch one Redis Cluster slot. Scripts receive every
key in KEYS and check every precondition before their first write (Lua never rolls back).

Round trips: ``create``, ``compare_and_set`` and the four lease primitives are one EVALSHA
each; ``get`` is one HGETALL; ``scan`` is one ZRANGE per (state, bucket) it walks plus one
pipeline fetching the page's records. ``compare_and_set`` must name the index the record
leaves, which only the stored state tells: the store remembers the state of every
(kind, id, version) it has read or written (a version is written once, so the hint is a fact;
the script still verifies it) and otherwise guesses the new state; a wrong guess costs a second
round trip.

Redis Cluster: record primitives and lease primitives each stay in one slot, but a *fenced*
compare-and-set also reads the lease's fence counter, which lives in another slot. Fenced
writes therefore need a single Redis (or a replica set behind a proxy that runs the script on
one node); on Cluster they fail with CROSSSLOT rather than write unfenced.

Corrupt data (a key of the wrong type, missing or malformed fields) raises
``InvalidRecordError`` from ``get`` and ``compare_and_set``. ``scan`` instead yields such a
record as a placeholder envelope with ``version`` 0 and an empty body, so one bad record cannot
block every later sweep: decoding it raises ``InvalidRecordError`` naming its kind and id, and
the sweep reports it. Every driver error becomes ``StoreError`` in ``_driver``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError, ResponseError

from ..._values import MAX_SAFE_INTEGER, duration_ms, timestamp_ms, token
from ...errors import FencedWriteRefused, InvalidRecordError, SagaValidationError, StoreError
from .._cursor import decode_cursor, encode_cursor
from ..base import (
    Envelope,
    Fence,
    Lease,
    Page,
    check_envelope,
    check_key,
    check_lease_args,
    check_scan_args,
)
from ._keys import DEFAULT_BUCKETS, DEFAULT_PREFIX, KeyLayout
from ._scripts import Scripts

__all__ = ["RedisStore"]

_HINTS = 4096
_MOVED_RETRIES = 3
_Position = tuple[int, int, int, str]  # (state index, bucket, updated_at_ms, id)


class RedisStore:
    """Envelopes and leases in Redis; every primitive is atomic on the server."""

    durable = True

    def __init__(
        self, client: Redis, *, prefix: str = DEFAULT_PREFIX, buckets: int = DEFAULT_BUCKETS
    ) -> None:
        self._layout = KeyLayout(prefix, buckets)
        self._client = client
        self._owns_client = False
        self._scripts = Scripts.register(client)
        self._hints = _StateHints(_HINTS)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        buckets: int = DEFAULT_BUCKETS,
        **client_options: Any,
    ) -> RedisStore:
        """Open a store on ``redis://``, ``rediss://`` or ``unix://``; ``close()`` closes it."""
        KeyLayout(prefix, buckets)
        try:
            client = Redis.from_url(url, **client_options)
        except (ValueError, TypeError, RedisError) as exc:
            # The driver's message can quote the URL, password included.
            raise StoreError(f"cannot open a Redis client: {type(exc).__name__}") from exc
        store = cls(client, prefix=prefix, buckets=buckets)
        store._owns_client = True
        return store

    @property
    def layout(self) -> KeyLayout:
        """The key layout (prefix and bucket count) of this store."""
        return self._layout

    # ------------------------------------------------------------------ records

    def create(self, envelope: Envelope) -> bool:
        """Atomically insert if (kind, id) is absent; False if it exists. One EVALSHA."""
        check_envelope(envelope)
        body = _utf8(envelope.body)
        keys = [
            self._layout.record(envelope.kind, envelope.id),
            self._layout.record_index(envelope.kind, envelope.id, envelope.state),
        ]
        args: list[str | int | bytes] = [
            envelope.id,
            envelope.version,
            envelope.state,
            envelope.updated_at_ms,
            body,
        ]
        reply = self._run(self._scripts.create, keys, args, "create")
        if reply != 1:
            return False
        self._hints.note(envelope)
        return True

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope or None. One HGETALL."""
        check_key(kind, record_id)
        key = self._layout.record(kind, record_id)
        with self._driver("get", kind, record_id):
            fields = self._client.hgetall(key)
        if not fields:
            return None
        envelope = _parse_record(kind, record_id, fields)
        self._hints.note(envelope)
        return envelope

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Atomically replace the record if its version is ``expected_version``.

        True also when the identical write was already applied (a retried call); raises
        ``FencedWriteRefused`` when ``fence`` is older than the lease's newest grant.
        """
        check_envelope(envelope)
        if type(expected_version) is not int or envelope.version != expected_version + 1:
            raise SagaValidationError("the new version must be expected_version + 1")
        fence_keys, fence_args = self._fence(fence)
        kind, record_id = envelope.kind, envelope.id
        record_key = self._layout.record(kind, record_id)
        new_index = self._layout.record_index(kind, record_id, envelope.state)
        args: list[str | int | bytes] = [
            record_id,
            expected_version,
            envelope.version,
            envelope.state,
            envelope.updated_at_ms,
            _utf8(envelope.body),
        ]
        believed = self._hints.state_at(kind, record_id, expected_version) or envelope.state
        for _ in range(_MOVED_RETRIES):
            old_index = self._layout.record_index(kind, record_id, believed)
            keys = [record_key, old_index, new_index, *fence_keys]
            reply = self._run(self._scripts.compare_and_set, keys, [*args, believed, *fence_args], "cas")
            status, detail = _status(reply, kind, record_id)
            if status != "moved":
                return self._cas_outcome(envelope, status, detail, fence)
            believed = _stored_state(detail, kind, record_id)
        raise StoreError(f"{kind} {record_id!r} kept changing state during compare_and_set")

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        updated_before_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Return up to ``limit`` records of ``kind`` in ``states``; read-only.

        Walks state by state, bucket by bucket, oldest first within a bucket; touches only the
        indexes of the states asked for, so its cost follows the matching records.
        """
        check_scan_args(kind, states, limit, updated_before_ms)
        wanted = list(dict.fromkeys(states))
        first_state, start, (first_bucket,) = decode_cursor(cursor, wanted, extras=1)
        if not 0 <= first_bucket < self._layout.buckets:
            raise SagaValidationError("malformed scan cursor")
        positions: list[_Position] = []
        for index in range(first_state, len(wanted)):
            for bucket in range(first_bucket if index == first_state else 0, self._layout.buckets):
                resume = start if (index, bucket) == (first_state, first_bucket) else None
                key = self._layout.index(kind, wanted[index], bucket)
                found = self._index_range(key, resume, updated_before_ms, limit + 1 - len(positions))
                positions.extend((index, bucket, score, member) for score, member in found)
                if len(positions) > limit:
                    return self._page(kind, wanted, positions[:limit], positions[limit], updated_before_ms)
        return self._page(kind, wanted, positions, None, updated_before_ms)

    # ------------------------------------------------------------------ leases

    def acquire_lease(self, name: str, owner: str, token: str, now_ms: int, lease_ms: int) -> Lease | None:
        """Atomically grant the lease unless an unexpired one exists; bumps the fence."""
        check_lease_args(name, owner, token)
        expires = _expiry(now_ms, lease_ms)
        keys = self._layout.lease(name)
        reply = self._run(
            self._scripts.acquire_lease,
            [keys.holder, keys.fence, keys.cursor],
            [owner, token, now_ms, expires],
            "acquire_lease",
        )
        if not isinstance(reply, list) or len(reply) != 3 or _text(reply[0]) != "granted":
            return None
        return Lease(name, owner, token, expires, _integer(reply[1]), _optional_text(reply[2]))

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Atomically extend an unexpired lease held with the same owner and token."""
        check_lease_args(lease.name, lease.owner, lease.token)
        expires = _expiry(now_ms, lease_ms)
        keys = self._layout.lease(lease.name)
        reply = self._run(
            self._scripts.renew_lease,
            [keys.holder, keys.cursor],
            [lease.owner, lease.token, now_ms, expires],
            "renew_lease",
        )
        if not isinstance(reply, list) or len(reply) != 3 or _text(reply[0]) != "renewed":
            return None
        fence, cursor = _integer(reply[1]), _optional_text(reply[2])
        return Lease(lease.name, lease.owner, lease.token, expires, fence, cursor)

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Atomically save the scan cursor of an unexpired lease held with this token."""
        check_lease_args(lease.name, lease.owner, lease.token)
        timestamp_ms(now_ms, field="now_ms")
        if cursor is not None and not isinstance(cursor, str):
            raise SagaValidationError("cursor must be a str or None")
        keys = self._layout.lease(lease.name)
        flag = "0" if cursor is None else "1"
        args: list[str | int | bytes] = [lease.owner, lease.token, now_ms, flag, cursor or ""]
        reply = self._run(
            self._scripts.checkpoint_lease, [keys.holder, keys.cursor], args, "checkpoint_lease"
        )
        return reply == 1

    def release_lease(self, lease: Lease) -> bool:
        """Atomically free the lease if held with this owner and token; keeps the cursor."""
        check_lease_args(lease.name, lease.owner, lease.token)
        keys = self._layout.lease(lease.name)
        reply = self._run(
            self._scripts.release_lease, [keys.holder], [lease.owner, lease.token], "release_lease"
        )
        return reply == 1

    def close(self) -> None:
        """Close the connection pool if this store opened it (``from_url``)."""
        if self._owns_client:
            with self._driver("close"):
                self._client.close()

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def _driver(self, action: str, kind: str | None = None, record_id: str | None = None) -> Iterator[None]:
        """The one place driver errors become project errors."""
        try:
            yield
        except RedisError as exc:
            if kind is not None and record_id is not None and _wrong_type(exc):
                raise InvalidRecordError(kind=kind, record_id=record_id) from exc
            raise StoreError(f"redis {action} failed: {type(exc).__name__}: {exc}") from exc
        except UnicodeDecodeError as exc:  # a decode_responses client met binary garbage
            if kind is not None and record_id is not None:
                raise InvalidRecordError(kind=kind, record_id=record_id) from exc
            raise StoreError(f"redis {action} returned undecodable text") from exc

    def _run(
        self, script: Script, keys: Sequence[str], args: Sequence[str | int | bytes], action: str
    ) -> object:
        with self._driver(action):
            reply: object = script(keys=list(keys), args=list(args))
        return reply

    def _fence(self, fence: Fence | None) -> tuple[list[str], list[str | int | bytes]]:
        if fence is None:
            return [], []
        token(fence.lease, field="lease name", max_len=128)
        if type(fence.number) is not int or not 0 <= fence.number <= MAX_SAFE_INTEGER:
            raise SagaValidationError(f"fence number must be a non-negative int: {fence.number!r}")
        return [self._layout.lease(fence.lease).fence], [fence.number]

    def _cas_outcome(self, envelope: Envelope, status: str, detail: str, fence: Fence | None) -> bool:
        if status in ("written", "same"):
            self._hints.note(envelope)
            return True
        if status in ("stale", "absent"):
            return False
        if status == "fenced" and fence is not None:
            raise FencedWriteRefused(lease=fence.lease, fence=fence.number)
        if status == "corrupt":
            raise InvalidRecordError(
                f"store returned an invalid record ({envelope.kind} {envelope.id!r}): {detail}",
                kind=envelope.kind,
                record_id=envelope.id,
            )
        raise StoreError(f"unexpected compare_and_set reply {status!r}")

    def _index_range(
        self, key: str, start: tuple[int, str] | None, before_ms: int | None, want: int
    ) -> list[tuple[int, str]]:
        """Up to ``want`` (updated_at_ms, id) of one index, from ``start`` on (inclusive).

        Ties at the start's score sort by member, and the ones before ``start`` are read and
        dropped; when they fill a reply, reading goes on by offset. Each further read begins
        with the last row of the one before: if that row is not where it was, a concurrent
        write shifted the offsets, and reading starts again just after that row, so a shift
        can repeat a row already dropped but never skip one.
        """
        high = f"({before_ms}" if before_ms is not None else "+inf"
        low: int | str = start[0] if start else "-inf"
        after: tuple[int, str] | None = None  # rows up to it were read already
        found: list[tuple[int, str]] = []
        offset = 0
        last: tuple[int, str] | None = None  # the row the next read must begin with
        while len(found) < want:
            count = want - len(found) + (last is not None)
            with self._driver("scan"):
                rows: Any = self._client.zrange(
                    key, low, high, byscore=True, offset=offset, num=count, withscores=True
                )
            read = [(int(score), _text(member)) for member, score in rows]
            if last is not None:
                if not read or read[0] != last:
                    after = last if after is None else max(after, last)
                    low, offset, last = after[0], 0, None
                    continue
                read = read[1:]
            for position in read:
                if (start is None or position >= start) and (after is None or position > after):
                    found.append(position)
            if len(rows) < count:
                break
            offset += len(rows) - 1
            last = read[-1]  # a full reply holds at least one row past the one repeated
        return found

    def _page(
        self,
        kind: str,
        states: list[str],
        positions: list[_Position],
        following: _Position | None,
        before_ms: int | None,
    ) -> Page:
        """Fetch the records of ``positions`` in one pipeline; the cursor names ``following``.

        The cursor is the first position of the next page (inclusive), not the last one
        returned, so the next page does not walk again the empty buckets between them.
        A record written again since its index entry was read is returned at once if it still
        matches and its new position is one this scan has passed (it would never be met
        again), and left to its new position otherwise.
        """
        fetched = self._fetch(kind, [position[3] for position in positions])
        items: list[Envelope] = []
        returned: set[str] = set()
        for (index, bucket, score, member), fields in zip(positions, fetched, strict=True):
            envelope = _scanned(kind, states[index], score, member, fields)
            if envelope.id in returned:
                continue  # moved between two indexes this page read: returned once
            if (envelope.state, envelope.updated_at_ms) == (states[index], score) or _passed(
                envelope, bucket, states, before_ms, following
            ):
                items.append(envelope)
                returned.add(envelope.id)
        cursor = None
        if following is not None:
            index, bucket, score, member = following
            cursor = encode_cursor(states, states[index], (score, member), bucket)
        return Page(tuple(items), cursor)

    def _fetch(self, kind: str, record_ids: list[str]) -> list[object]:
        """HGETALL every record in one round trip; per-record errors come back as values."""
        if not record_ids:
            return []
        results: list[object] = [None] * len(record_ids)
        pipe = self._client.pipeline(transaction=False)
        slots: list[int] = []
        for i, record_id in enumerate(record_ids):
            try:
                token(record_id, field="record id", max_len=255)
            except SagaValidationError as exc:
                results[i] = exc  # a hand-written index member that names no record
                continue
            pipe.hgetall(self._layout.record(kind, record_id))
            slots.append(i)
        if slots:
            with self._driver("scan"):
                replies = pipe.execute(raise_on_error=False)
            for i, reply in zip(slots, replies, strict=True):
                results[i] = reply
        return results


class _StateHints:
    """Bounded memory of the state each (kind, id, version) was read or written with."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()

    def note(self, envelope: Envelope) -> None:
        """Remember the envelope's version and state."""
        key = (envelope.kind, envelope.id)
        with self._lock:
            self._seen[key] = (envelope.version, envelope.state)
            self._seen.move_to_end(key)
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def state_at(self, kind: str, record_id: str, version: int) -> str | None:
        """The state of that version, if this process saw it."""
        with self._lock:
            seen = self._seen.get((kind, record_id))
        return seen[1] if seen is not None and seen[0] == version else None


# ---------------------------------------------------------------------- decoding


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise StoreError(f"unexpected reply from Redis: {type(value).__name__}")


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _integer(value: object) -> int:
    text = _text(value) if not isinstance(value, int) else str(value)
    if not text.isdigit():
        raise StoreError(f"unexpected integer reply from Redis: {text[:40]!r}")
    return int(text)


def _utf8(body: str) -> bytes:
    try:
        return body.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SagaValidationError("body must be valid UTF-8 text") from exc


def _expiry(now_ms: int, lease_ms: int) -> int:
    timestamp_ms(now_ms, field="now_ms")
    duration_ms(lease_ms, field="lease_ms")
    return timestamp_ms(now_ms + lease_ms, field="lease expiry")


def _wrong_type(exc: RedisError) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")


def _status(reply: object, kind: str, record_id: str) -> tuple[str, str]:
    if not isinstance(reply, list) or len(reply) != 2:
        raise StoreError(f"unexpected compare_and_set reply for {kind} {record_id!r}")
    return _text(reply[0]), _text(reply[1])


def _stored_state(state: str, kind: str, record_id: str) -> str:
    try:
        return token(state, field="record state", max_len=64)
    except SagaValidationError as exc:
        raise InvalidRecordError(kind=kind, record_id=record_id) from exc


def _decimal(text: str, *, low: int) -> int | None:
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    value = int(text)
    return value if low <= value <= MAX_SAFE_INTEGER else None


def _parse_record(kind: str, record_id: str, fields: Mapping[Any, Any]) -> Envelope:
    """Turn a record hash into an envelope, or raise ``InvalidRecordError``."""
    fail = InvalidRecordError(kind=kind, record_id=record_id)
    try:
        text = {_text(name): _text(value) for name, value in fields.items()}
    except (UnicodeDecodeError, StoreError) as exc:
        raise fail from exc
    missing = {"id", "version", "state", "updated_at_ms", "body"} - text.keys()
    if missing or text["id"] != record_id:
        raise fail
    version = _decimal(text["version"], low=1)
    updated = _decimal(text["updated_at_ms"], low=0)
    if version is None or updated is None:
        raise fail
    state = _stored_state(text["state"], kind, record_id)
    return Envelope(kind, record_id, version, state, updated, text["body"])


def _passed(
    envelope: Envelope, bucket: int, states: list[str], before_ms: int | None, following: _Position | None
) -> bool:
    """True if ``envelope`` still matches the scan at a position before ``following``."""
    if envelope.state not in states or (before_ms is not None and envelope.updated_at_ms >= before_ms):
        return False
    position = (states.index(envelope.state), bucket, envelope.updated_at_ms, envelope.id)
    return following is None or position < following


def _scanned(kind: str, state: str, score: int, record_id: str, fields: object) -> Envelope:
    """The envelope of one index entry as fetched: a placeholder if it is corrupt."""
    placeholder = Envelope(kind, record_id, 0, state, score, "")
    if isinstance(fields, ResponseError) and _wrong_type(fields):
        return placeholder
    if isinstance(fields, RedisError):
        raise StoreError(f"redis scan failed: {type(fields).__name__}: {fields}") from fields
    if isinstance(fields, SagaValidationError) or not isinstance(fields, Mapping) or not fields:
        return placeholder
    try:
        return _parse_record(kind, record_id, fields)
    except InvalidRecordError:
        return placeholder
