"""RedisStore: the production store, each mutating primitive one Lua script (docs/design.md §4).

Layout (``_keys.py``): a record is a hash in bucket ``crc32(id) % buckets``; its state, label
and due indexes are sorted sets of that bucket, and every key of a bucket shares the hash tag
``{<prefix>:<bucket>}``, so every script touches one Redis Cluster slot. A lease lives in the
bucket it guards, so a fenced write checks its fence in the slot it writes. Scripts receive
every key in KEYS and check every precondition before their first write (Lua never rolls
back).

Round trips: ``create``, ``compare_and_set``, ``annotate``, ``delete`` and the lease primitives
are one EVALSHA each; ``get`` is one HGETALL; ``scan``/``scan_due`` are one ZRANGE per index
they walk plus one pipeline fetching the page's records; ``count`` is one pipeline of ZCOUNTs.
``compare_and_set`` and ``delete`` must name the index the record leaves, which only the
stored state tells: the store remembers the state of every (kind, id, version) it has read or
written (a version is written once, so the hint is a fact; the script still verifies it) and
otherwise guesses the new state; a wrong guess costs a second round trip.

Corrupt data (a key of the wrong type, missing or malformed fields) raises
``InvalidRecordError`` from ``get`` and ``compare_and_set``. ``scan`` instead yields such a
record as a placeholder envelope with ``version`` 0 and an empty body, so one bad record cannot
block every later sweep: decoding it raises ``InvalidRecordError`` naming its kind and id, and
the sweep reports it. Every driver error becomes ``StoreError`` in ``_driver``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from ..._values import MAX_SAFE_INTEGER, token
from ...errors import (
    FencedWriteRefused,
    InvalidRecordError,
    SagaValidationError,
    StoreError,
    StoreUnavailable,
)
from .._cursor import decode_cursor, encode_cursor, encode_position
from .._urls import CLUSTER_SCHEMES, flag_value, redact, redact_text, split_cluster, url_problem
from .._validating import ValidatingScanStore
from ..base import (
    MAX_NOTES,
    Envelope,
    Fence,
    Lease,
    LeaseHolder,
    Page,
    check_scan_args,
    check_state,
    prefix_end,
)
from ._hints import scheme_hint
from ._keys import DEFAULT_BUCKETS, DEFAULT_PREFIX, KeyLayout, check_buckets
from ._persistence import Persistence
from ._scripts import Scripts, script_text

__all__ = ["RedisStore"]

_HINTS = 4096
_MOVED_RETRIES = 3
_Position = tuple[int, int, int, str]  # (state index, bucket, score, id)
_Slot = tuple[int, int, str]  # (state index, bucket, index key)
_DUE = ["due"]  # the one "state" a due-scan cursor names
_STORE_OPTIONS = frozenset({"buckets", "require_aof"})  # URL options the store reads itself
_PREFIX_ROUNDS = 8  # id-index reads one prefix-scan page makes at most to fill itself
_BACKFILL_BATCH = 1000  # ids one backfill round trip indexes


class RedisStore(ValidatingScanStore):
    """Envelopes and leases in Redis; every primitive is atomic on the server (arguments are
    checked by ``ValidatingStore``, docs/design.md §4.4).

    On first use the store reads the server's persistence and refuses a server without an
    append-only file (``NonDurableStoreError``) unless ``require_aof=False`` (``_persistence.py``).
    """

    def __init__(
        self, client: Any, *, prefix: str = DEFAULT_PREFIX, buckets: int = DEFAULT_BUCKETS,
        require_aof: bool = True,
    ) -> None:
        self._layout = KeyLayout(prefix, buckets)
        self._client = client
        self._owns_client = False
        self._scripts = Scripts.register(client)
        self._hints = _StateHints(_HINTS)
        self._persistence = Persistence(client, require_aof=require_aof)

    @property
    def durable(self) -> bool:
        """Whether what the store acknowledged survives a crash of its server: False once the
        server was found without AOF and accepted (``require_aof=False``); True otherwise, the
        store refusing such a server on first use."""
        return self._persistence.durable

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        buckets: int | None = None,
        require_aof: bool = True,
        **client_options: Any,
    ) -> RedisStore:
        """Open a store on ``redis://``, ``rediss://``, ``unix://`` or, for Redis Cluster,
        ``redis+cluster://host:port[,host:port...]/`` and ``rediss+cluster://...``
        (``?buckets=N`` sets the bucket count, default 16; ``?require_aof=false`` accepts a
        server without AOF, as ``require_aof=False`` does); ``close()`` closes the client."""
        problem = url_problem(url)
        if problem is not None:
            raise StoreUnavailable(problem)
        url, in_url, aof_in_url = _split_store_options(url)
        count = check_buckets(buckets if buckets is not None else (in_url or DEFAULT_BUCKETS))
        KeyLayout(prefix, count)
        try:
            client = _open_client(url, client_options)
        except (ValueError, TypeError, RedisError, RedisClusterException) as exc:
            # The driver's message can quote the URL, password included.
            hint = scheme_hint(exc)
            raise StoreError(
                f"cannot open a Redis client on {redact(url)}: {type(exc).__name__}"
                + (f": {hint}" if hint else "")
            ) from exc
        store = cls(client, prefix=prefix, buckets=count,
                    require_aof=require_aof and aof_in_url is not False)
        store._owns_client = True
        return store

    @property
    def layout(self) -> KeyLayout:
        """The key layout (prefix and bucket count) of this store."""
        return self._layout

    @property
    def buckets(self) -> int:
        """How many buckets records, scans and leases are split into."""
        return self._layout.buckets

    def bucket_of(self, record_id: str) -> int:
        """CRC-32 of the id modulo the bucket count."""
        return self._layout.bucket(record_id)

    # ------------------------------------------------------------------ records

    def _create(self, envelope: Envelope) -> bool:
        """Insert if (kind, id) is absent; False if it exists. One EVALSHA."""
        kind, record_id, state, label = envelope.kind, envelope.id, envelope.state, envelope.label
        state_index = self._layout.record_index(kind, record_id, state)
        keys = [
            self._layout.record(kind, record_id),
            state_index,
            self._layout.record_index(kind, record_id, state, label) if label else state_index,
            self._layout.due(kind, self.bucket_of(record_id)),
            self._layout.ids(kind, self.bucket_of(record_id)),
            self._layout.created(kind, self.bucket_of(record_id)),
        ]
        args: list[str | int | bytes] = [
            record_id, envelope.version, state, envelope.updated_at_ms, _utf8(envelope.body),
            label or "", _optional_int(envelope.due_at_ms),
        ]
        if self._run(self._scripts.create, keys, args, "create") != 1:
            return False
        self._hints.note(envelope)
        return True

    def _get(self, kind: str, record_id: str) -> Envelope | None:
        """The stored envelope (with its notes) or None. One HGETALL."""
        with self._driver("get", kind, record_id):
            fields = self._client.hgetall(self._layout.record(kind, record_id))
        if not fields:
            return None
        envelope = _parse_record(kind, record_id, fields)
        self._hints.note(envelope)
        return envelope

    def _compare_and_set(self, envelope: Envelope, expected_version: int, fence: Fence | None) -> bool:
        """One EVALSHA; a second one when the state the record leaves was guessed wrong."""
        fence_keys, fence_args = self._fence(fence)
        kind, record_id, state, label = envelope.kind, envelope.id, envelope.state, envelope.label
        layout = self._layout
        args: list[str | int | bytes] = [
            record_id, expected_version, envelope.version, state, envelope.updated_at_ms,
            _utf8(envelope.body),
        ]
        tail: list[str | int | bytes] = [label or "", _optional_int(envelope.due_at_ms), *fence_args]
        hint = self._hints.at(kind, record_id, expected_version)
        believed = hint[0] if hint is not None else state
        new_index = layout.record_index(kind, record_id, state)
        due = layout.due(kind, self.bucket_of(record_id))
        for _ in range(_MOVED_RETRIES):
            old_index = layout.record_index(kind, record_id, believed)
            keys = [
                layout.record(kind, record_id), old_index, new_index,
                layout.record_index(kind, record_id, believed, label) if label else old_index,
                layout.record_index(kind, record_id, state, label) if label else new_index,
                due, *fence_keys,
            ]
            reply = self._run(self._scripts.compare_and_set, keys, [*args, believed, *tail], "cas")
            status, detail = _status(reply, kind, record_id)
            if status != "moved":
                return self._cas_outcome(envelope, status, detail, fence)
            believed = _stored_state(detail, kind, record_id)
        raise StoreError(f"{kind} {record_id!r} kept changing state during compare_and_set")

    def _annotate(self, kind: str, record_id: str, note: str, expected_version: int | None
                  ) -> Envelope | None:
        """Append ``note`` and bump the version; the record as written. One EVALSHA."""
        expected = "" if expected_version is None else str(expected_version)
        args: list[str | int | bytes] = [record_id, _utf8(note), expected, MAX_NOTES]
        keys = [self._layout.record(kind, record_id)]
        with self._driver("annotate", kind, record_id):
            reply: Any = self._scripts.annotate(keys=keys, args=args)
        if not reply:
            return None
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        envelope = _parse_record(kind, record_id, fields)
        self._hints.note(envelope)
        return envelope

    def _delete(self, kind: str, record_id: str, expected_version: int, fence: Fence | None) -> bool:
        """Remove the record and its index entries if its version matches. One EVALSHA."""
        fence_keys, fence_args = self._fence(fence)
        layout = self._layout
        state, label = self._hints.at(kind, record_id, expected_version) or ("-", "")
        for _ in range(_MOVED_RETRIES):
            state_index = layout.record_index(kind, record_id, state)
            keys = [
                layout.record(kind, record_id), state_index,
                layout.record_index(kind, record_id, state, label) if label else state_index,
                layout.due(kind, self.bucket_of(record_id)),
                layout.ids(kind, self.bucket_of(record_id)),
                layout.created(kind, self.bucket_of(record_id)), *fence_keys,
            ]
            args: list[str | int | bytes] = [record_id, expected_version, state, label, *fence_args]
            status, detail = _status(self._run(self._scripts.delete, keys, args, "delete"),
                                     kind, record_id)
            if status == "moved":
                stored_state, _, stored_label = detail.partition("\n")
                state, label = _stored_state(stored_state, kind, record_id), stored_label
                continue
            if status == "fenced" and fence is not None:
                raise FencedWriteRefused(lease=fence.lease, fence=fence.number)
            if status == "corrupt":
                raise InvalidRecordError(kind=kind, record_id=record_id)
            if status == "deleted":
                self._hints.forget(kind, record_id)
            return status == "deleted"
        raise StoreError(f"{kind} {record_id!r} kept changing state during delete")

    # ------------------------------------------------------------------ scans

    def _scan(self, kind: str, wanted: list[str], label: str | None, updated_before_ms: int | None,
              bucket: int | None, cursor: str | None, limit: int) -> Page:
        """Walks state by state, bucket by bucket, oldest first within a bucket; touches only the
        indexes asked for, so its cost follows the matching records."""
        slots = [
            (i, b, self._layout.index(kind, state, b, label))
            for i, state in enumerate(wanted) for b in self._walked(bucket)
        ]

        def matches(envelope: Envelope, slot: int, score: int) -> bool:
            return (envelope.state, envelope.updated_at_ms) == (wanted[slot], score)

        def still(envelope: Envelope) -> tuple[int, int] | None:
            if envelope.state not in wanted or envelope.label != label:
                return None
            if updated_before_ms is not None and envelope.updated_at_ms >= updated_before_ms:
                return None
            return wanted.index(envelope.state), envelope.updated_at_ms

        return self._walk(kind, wanted, slots, cursor, updated_before_ms, limit, matches, still)

    def _scan_due(self, kind: str, due_before_ms: int, bucket: int | None, cursor: str | None,
                  limit: int) -> Page:
        """Records whose due time is before ``due_before_ms``, bucket by bucket, earliest first."""
        slots = [(0, b, self._layout.due(kind, b)) for b in self._walked(bucket)]

        def matches(envelope: Envelope, slot: int, score: int) -> bool:
            return envelope.due_at_ms == score

        def still(envelope: Envelope) -> tuple[int, int] | None:
            due = envelope.due_at_ms
            return None if due is None or due >= due_before_ms else (0, due)

        return self._walk(kind, _DUE, slots, cursor, due_before_ms, limit, matches, still)

    def _count(self, kind: str, wanted: list[str], label: str | None, updated_after_ms: int | None,
               updated_before_ms: int | None) -> int:
        """ZCOUNT every matching index of every bucket, in one pipeline."""
        low: int | str = updated_after_ms if updated_after_ms is not None else "-inf"
        high = f"({updated_before_ms}" if updated_before_ms is not None else "+inf"
        pipe = self._client.pipeline(transaction=False)
        for state in wanted:
            for bucket in range(self.buckets):
                pipe.zcount(self._layout.index(kind, state, bucket, label), low, high)
        with self._driver("count"):
            replies = pipe.execute()
        return sum(int(n) for n in replies)

    def _scan_prefix(self, kind: str, prefix: str, wanted: list[str], label: str | None,
                     cursor: str | None, limit: int) -> Page:
        """Ids from every bucket's id index (``ZRANGE BYLEX`` of [cursor or prefix, next
        prefix), one pipeline), merged by id; their records fetched in one more, those of other
        states or labels dropped. Reads again until the page is full or the ids run out, at
        most ``_PREFIX_ROUNDS`` times (a page can hold fewer than ``limit``; its cursor goes
        on). Records written before the id index existed need ``index_ids`` once."""
        start, end = cursor or prefix, prefix_end(prefix)
        items: list[Envelope] = []
        for _ in range(_PREFIX_ROUNDS):
            ids = self._ids_from(kind, start, end, limit + 1)
            for n, envelope in self._prefixed(kind, ids[:limit], wanted, label):
                items.append(envelope)
                if len(items) == limit:
                    return Page(tuple(items), ids[n + 1] if n + 1 < len(ids) else None)
            if len(ids) <= limit:
                return Page(tuple(items), None)
            start = ids[limit]
        return Page(tuple(items), start)

    def _ids_from(self, kind: str, start: str, end: str, want: int) -> list[str]:
        """The first ``want`` ids in [start, end) over every bucket's id index."""
        pipe = self._client.pipeline(transaction=False)
        for bucket in range(self.buckets):
            pipe.zrangebylex(self._layout.ids(kind, bucket), f"[{start}", f"({end}", 0, want)
        with self._driver("scan"):
            replies = pipe.execute()
        return sorted(_text(member) for reply in replies for member in reply)[:want]

    def _prefixed(self, kind: str, ids: list[str], wanted: list[str], label: str | None
                  ) -> Iterator[tuple[int, Envelope]]:
        """(position in ``ids``, record) of the records of ``ids`` in ``wanted`` states (and
        ``label``), corrupt ones as placeholders; ids whose record is gone are skipped."""
        for n, (record_id, fields) in enumerate(zip(ids, self._fetch(kind, ids), strict=True)):
            envelope = _scanned(kind, wanted[0], 0, record_id, fields)
            if envelope is not None and (envelope.version == 0 or (
                    envelope.state in wanted and label in (None, envelope.label))):
                yield n, envelope

    def _scan_ordered(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """The next ``limit + 1`` entries of every (state, bucket) index in that direction (one
        pipeline), merged by (score, id); the first ``limit`` records fetched in one more. A
        record written again since its entry was read is left to its new place (``OrderedScan``)."""
        keys = [self._layout.index(kind, state, bucket, label)
                for state in states for bucket in range(self.buckets)]
        found = sorted((p for rows in self._ordered_rows(keys, at, before, newest_first, limit + 1)
                        for p in rows), reverse=newest_first)[:limit + 1]
        page = found[:limit]
        items = []
        for (score, member), fields in zip(page, self._fetch(kind, [m for _, m in page]), strict=True):
            envelope = _scanned(kind, states[0], score, member, fields)
            if envelope is not None and (envelope.version == 0 or (
                    envelope.state in states and envelope.updated_at_ms == score
                    and label in (None, envelope.label))):
                items.append(envelope)
        return Page(tuple(items), encode_position(found[limit]) if len(found) > limit else None)

    def _scan_created(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """Every bucket's creation index read from ``at`` (one pipeline), merged by (score, id);
        the records fetched in one more, those of other states or labels or last written from
        ``before`` on dropped. Reads again until the page is full or the index runs out, at
        most ``_PREFIX_ROUNDS`` times (a page can hold fewer than ``limit``; its cursor goes
        on). Records written before the index existed need ``index_ids`` once."""
        keys = [self._layout.created(kind, bucket) for bucket in range(self.buckets)]
        items: list[Envelope] = []
        for _ in range(_PREFIX_ROUNDS):
            found = sorted((p for rows in self._ordered_rows(keys, at, None, newest_first, limit + 1)
                            for p in rows), reverse=newest_first)[:limit + 1]
            for n, envelope in self._prefixed(kind, [m for _, m in found[:limit]], states, label):
                if before is not None and envelope.version and envelope.updated_at_ms >= before:
                    continue
                items.append(envelope)
                if len(items) == limit:
                    following = found[n + 1] if n + 1 < len(found) else None
                    return Page(tuple(items), encode_position(following, "created") if following else None)
            if len(found) <= limit:
                return Page(tuple(items), None)
            at = found[limit]
        return Page(tuple(items), encode_position(at, "created") if at else None)

    def _ordered_rows(self, keys: list[str], at: tuple[int, str] | None, before: int | None,
                      newest_first: bool, want: int) -> list[list[tuple[int, str]]]:
        """Per index, its first ``want`` (score, id) from ``at`` (inclusive) in that direction,
        below ``before``: one pipeline, then a further read of an index whose reply was all ties
        before ``at`` (entries of one millisecond sort by id)."""
        top = f"({before}" if before is not None else "+inf"
        low: int | str = "-inf" if newest_first or at is None else at[0]
        high: int | str = at[0] if newest_first and at is not None else top
        bounds = (high, low) if newest_first else (low, high)
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.zrange(key, *bounds, desc=newest_first, byscore=True, offset=0, num=want,
                        withscores=True)
        with self._driver("scan"):
            replies = pipe.execute()
        rows = []
        for key, reply in zip(keys, replies, strict=True):
            read = [(int(score), _text(member)) for member, score in reply]
            kept = _from_position(read, at, newest_first)
            offset = len(read)
            while len(read) == want and len(kept) < want:  # ties before ``at`` filled the reply
                with self._driver("scan"):
                    more: Any = self._client.zrange(key, *bounds, desc=newest_first, byscore=True,
                                                    offset=offset, num=want, withscores=True)
                read = [(int(score), _text(member)) for member, score in more]
                kept += _from_position(read, at, newest_first)
                offset += len(read)
            rows.append(kept[:want])
        return rows

    def index_ids(self, kind: str, states: Sequence[str]) -> int:
        """Add the records of ``kind`` in ``states`` to their bucket's id index, which
        ``scan_prefix`` reads: once after upgrading a store holding records written before the
        index existed (``celery sagas reindex``); idempotent, never indexes a record deleted
        meanwhile. A record moved between states while it runs can be missed: run it again
        after the last process was upgraded. Returns how many ids it added."""
        wanted = check_scan_args(kind, states, 1, None)
        added = 0
        for bucket in range(self.buckets):
            for state in wanted:
                key = self._layout.index(kind, state, bucket)
                start: tuple[int, str] | None = None
                while True:
                    found = self._index_range(key, start, None, _BACKFILL_BATCH + 1)
                    added += self._index_batch(kind, bucket, [m for _, m in found[:_BACKFILL_BATCH]])
                    if len(found) <= _BACKFILL_BATCH:
                        break
                    start = found[_BACKFILL_BATCH]
        return added

    def _index_batch(self, kind: str, bucket: int, ids: list[str]) -> int:
        """Run ``index_id`` for each id in one pipeline (EVAL: a cluster pipeline has no
        script cache to fall back on); how many were added."""
        if not ids:
            return 0
        text, index = script_text("index_id"), self._layout.ids(kind, bucket)
        created = self._layout.created(kind, bucket)
        pipe = self._client.pipeline(transaction=False)
        for record_id in ids:
            pipe.eval(text, 3, self._layout.record(kind, record_id), index, created, record_id)
        with self._driver("index_ids"):
            return sum(int(n) for n in pipe.execute())

    def _count_snapshot(self, kind: str, states: list[str], labels: list[str]
                        ) -> dict[tuple[str, str | None], int]:
        """ZCARD of every (state[, label], bucket) index: one MULTI/EXEC, so one snapshot; on
        Redis Cluster (buckets span nodes) one pipeline, each bucket read at its own instant
        (``CountSnapshot``)."""
        wanted = [(state, label) for state in states for label in (None, *labels)]
        pipe = self._client.pipeline(transaction=not isinstance(self._client, RedisCluster))
        for state, label in wanted:
            for bucket in range(self.buckets):
                pipe.zcard(self._layout.index(kind, state, bucket, label))
        with self._driver("count"):
            replies = pipe.execute()
        sizes = [int(n) for n in replies]
        per = self.buckets
        return {key: sum(sizes[i * per:(i + 1) * per]) for i, key in enumerate(wanted)}

    # ------------------------------------------------------------------ leases

    def _acquire_lease(self, name: str, owner: str, token: str, now_ms: int, expires: int,
                       bucket: int) -> Lease | None:
        """Grant the lease of ``bucket`` unless an unexpired one exists. One EVALSHA."""
        key = self._layout.lease(name, bucket)
        reply = self._run(self._scripts.acquire_lease, [key], [owner, token, now_ms, expires],
                          "acquire_lease")
        if not isinstance(reply, list) or len(reply) < 2 or _text(reply[0]) != "granted":
            return None
        cursor = _optional_text(reply[2]) if len(reply) > 2 else None
        return Lease(name, owner, token, expires, _integer(reply[1]), cursor, bucket)

    def _renew_lease(self, lease: Lease, now_ms: int, expires: int) -> Lease | None:
        """Extend an unexpired lease held with the same owner and token. One EVALSHA."""
        key = self._layout.lease(lease.name, lease.bucket)
        reply = self._run(self._scripts.renew_lease, [key],
                          [lease.owner, lease.token, now_ms, expires], "renew_lease")
        if not isinstance(reply, list) or len(reply) < 2 or _text(reply[0]) != "renewed":
            return None
        cursor = _optional_text(reply[2]) if len(reply) > 2 else None
        return Lease(lease.name, lease.owner, lease.token, expires, _integer(reply[1]), cursor,
                     lease.bucket)

    def _checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Save the scan cursor of an unexpired lease held with this token. One EVALSHA."""
        key = self._layout.lease(lease.name, lease.bucket)
        flag = "0" if cursor is None else "1"
        args: list[str | int | bytes] = [lease.owner, lease.token, now_ms, flag, cursor or ""]
        return self._run(self._scripts.checkpoint_lease, [key], args, "checkpoint_lease") == 1

    def _release_lease(self, lease: Lease) -> bool:
        """Free the lease if held with this owner and token; keeps the cursor. One EVALSHA."""
        key = self._layout.lease(lease.name, lease.bucket)
        reply = self._run(self._scripts.release_lease, [key], [lease.owner, lease.token],
                          "release_lease")
        return reply == 1

    def _lease_holder(self, name: str, bucket: int) -> LeaseHolder | None:
        """The holder of the lease of ``bucket``, expired or not: one HMGET (``LeaseTakeover``)."""
        key = self._layout.lease(name, bucket)
        with self._driver("lease_holder"):
            owner, fence, expires = self._client.hmget(key, ["owner", "fence", "expires_at_ms"])
        if owner is None or fence is None or expires is None:
            return None
        return LeaseHolder(_text(owner), _integer(fence), _integer(expires))

    def _take_over_lease(self, name: str, owner: str, token: str, expires: int,
                         expected_fence: int, bucket: int) -> Lease | None:
        """Grant the lease while its newest grant is ``expected_fence``, in the lease key's
        slot. One EVALSHA (``LeaseTakeover``)."""
        key = self._layout.lease(name, bucket)
        reply = self._run(self._scripts.take_over_lease, [key],
                          [owner, token, expected_fence, expires], "take_over_lease")
        if not isinstance(reply, list) or len(reply) < 2 or _text(reply[0]) != "granted":
            return None
        cursor = _optional_text(reply[2]) if len(reply) > 2 else None
        return Lease(name, owner, token, expires, _integer(reply[1]), cursor, bucket)

    @property
    def settle_channel(self) -> str:
        """The pub/sub channel ``notify_settled`` publishes on: ``<prefix>:settled``."""
        return f"{self._layout.prefix}:settled"

    def notify_settled(self, record_id: str) -> None:
        """PUBLISH the id on ``settle_channel`` (one round trip); a failure is ignored: a
        listener that misses it finds the saga settled on its next poll."""
        with suppress(StoreError), self._driver("publish"):
            self._client.publish(self.settle_channel, record_id)

    def close(self) -> None:
        """Close the connection pool if this store opened it (``from_url``)."""
        if self._owns_client:
            with self._driver("close"):
                self._client.close()

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def _driver(self, action: str, kind: str | None = None, record_id: str | None = None) -> Iterator[None]:
        """The one place driver errors become project errors; the first use checks the
        server's persistence."""
        try:
            if action != "close":
                self._persistence.check()
            yield
        except (RedisError, RedisClusterException) as exc:
            if kind is not None and record_id is not None and _wrong_type(exc):
                raise InvalidRecordError(kind=kind, record_id=record_id) from exc
            hint = scheme_hint(exc)
            raise StoreError(
                f"redis {action} failed: {type(exc).__name__}: {redact_text(str(exc))}"
                + (f" ({hint})" if hint else "")
            ) from exc
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

    def _walked(self, bucket: int | None) -> range:
        return range(self.buckets) if bucket is None else range(bucket, bucket + 1)

    def _fence(self, fence: Fence | None) -> tuple[list[str], list[str | int | bytes]]:
        if fence is None:
            return [], []
        return [self._layout.lease(fence.lease, fence.bucket)], [fence.number]

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

    # ------------------------------------------------------------------ paged walks

    def _walk(
        self,
        kind: str,
        names: list[str],
        slots: list[_Slot],
        cursor: str | None,
        before: int | None,
        limit: int,
        matches: Callable[[Envelope, int, int], bool],
        still: Callable[[Envelope], tuple[int, int] | None],
    ) -> Page:
        """Read ``slots`` (index keys in walk order) from the cursor on, then fetch the page.

        ``matches`` says whether a fetched record is still where its index entry said;
        ``still`` gives (name index, score) of a record that still matches the walk at all.
        """
        first_name, start, (first_bucket,) = decode_cursor(cursor, names, extras=1)
        begin = next((n for n, (i, b, _) in enumerate(slots) if (i, b) == (first_name, first_bucket)),
                     None)
        if begin is None:
            if cursor is not None:
                raise SagaValidationError("malformed scan cursor")
            begin = 0
        positions: list[_Position] = []
        for n in range(begin, len(slots)):
            index, bucket, key = slots[n]
            resume = start if n == begin else None
            found = self._index_range(key, resume, before, limit + 1 - len(positions))
            positions.extend((index, bucket, score, member) for score, member in found)
            if len(positions) > limit:
                return self._page(kind, names, slots, positions[:limit], positions[limit], matches,
                                  still)
        return self._page(kind, names, slots, positions, None, matches, still)

    def _index_range(
        self, key: str, start: tuple[int, str] | None, before_ms: int | None, want: int
    ) -> list[tuple[int, str]]:
        """Up to ``want`` (score, id) of one index, from ``start`` on (inclusive).

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
        names: list[str],
        slots: list[_Slot],
        positions: list[_Position],
        following: _Position | None,
        matches: Callable[[Envelope, int, int], bool],
        still: Callable[[Envelope], tuple[int, int] | None],
    ) -> Page:
        """Fetch the records of ``positions`` in one pipeline; the cursor names ``following``.

        The cursor is the first position of the next page (inclusive), not the last one
        returned, so the next page does not walk again the empty buckets between them.
        A record written again since its index entry was read is returned at once if it still
        matches and its new position is one this scan has passed (it would never be met
        again), and left to its new position otherwise.
        """
        fetched = self._fetch(kind, [position[3] for position in positions])
        dangling = self._dangling(slots, positions, fetched)
        items: list[Envelope] = []
        returned: set[str] = set()
        for (index, bucket, score, member), fields in zip(positions, fetched, strict=True):
            envelope = _scanned(kind, names[index], score, member, fields)
            if envelope is None and member in dangling:
                envelope = Envelope(kind, member, 0, names[index], score, "")  # reported corrupt
            if envelope is None or envelope.id in returned:
                continue  # deleted since its entry was read, or moved between two indexes
            if envelope.version == 0 or matches(envelope, index, score) or _passed(
                envelope, bucket, still, following
            ):
                items.append(envelope)
                returned.add(envelope.id)
        cursor = None
        if following is not None:
            index, bucket, score, member = following
            cursor = encode_cursor(names, names[index], (score, member), bucket)
        return Page(tuple(items), cursor)

    def _dangling(self, slots: list[_Slot], positions: list[_Position],
                  fetched: list[object]) -> set[str]:
        """Ids whose record is gone but whose index entry is still there (one more round trip,
        only when a record is missing): never a concurrent delete, which removes both at once."""
        keys = {(index, bucket): key for index, bucket, key in slots}
        absent = [(keys[(p[0], p[1])], p[3]) for p, fields in zip(positions, fetched, strict=True)
                  if isinstance(fields, Mapping) and not fields]
        if not absent:
            return set()
        pipe = self._client.pipeline(transaction=False)
        for key, member in absent:
            pipe.zscore(key, member)
        with self._driver("scan"):
            scores = pipe.execute()
        return {member for (_, member), score in zip(absent, scores, strict=True) if score is not None}

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
    """Bounded memory of the state and label each (kind, id, version) was read or written with."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], tuple[int, str, str]] = OrderedDict()

    def note(self, envelope: Envelope) -> None:
        """Remember the envelope's version, state and label."""
        key = (envelope.kind, envelope.id)
        with self._lock:
            self._seen[key] = (envelope.version, envelope.state, envelope.label or "")
            self._seen.move_to_end(key)
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def forget(self, kind: str, record_id: str) -> None:
        """Drop what is known of a deleted record."""
        with self._lock:
            self._seen.pop((kind, record_id), None)

    def at(self, kind: str, record_id: str, version: int) -> tuple[str, str] | None:
        """The (state, label) of that version, if this process saw it."""
        with self._lock:
            seen = self._seen.get((kind, record_id))
        return (seen[1], seen[2]) if seen is not None and seen[0] == version else None


# ---------------------------------------------------------------------- decoding


def _open_client(url: str, options: dict[str, Any]) -> Any:
    """A ``Redis`` client, or a ``RedisCluster`` one for a ``redis+cluster://`` URL."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in CLUSTER_SCHEMES:
        return Redis.from_url(url, **options)
    parsed = split_cluster(url)
    nodes = [ClusterNode(host, port) for host, port in parsed.nodes[1:]]  # type: ignore[no-untyped-call]
    return RedisCluster.from_url(parsed.node_url, startup_nodes=nodes,
                                 **{**parsed.options, **options})


def _split_store_options(url: str) -> tuple[str, int | None, bool | None]:
    """Take the store's own ``buckets=N`` and ``require_aof=`` out of a URL's query (redis-py
    would refuse them): (the URL without them, buckets, require_aof), None where absent."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return url, None, None
    kept = [(k, v) for k, v in query if k not in _STORE_OPTIONS]
    if len(kept) == len(query):
        return url, None, None
    buckets = [v for k, v in query if k == "buckets"]
    aof = [v for k, v in query if k == "require_aof"]
    if len(buckets) > 1 or (buckets and not buckets[0].isdigit()):
        raise StoreError("the Redis store URL's buckets= must be one integer")
    if len(aof) > 1 or (aof and flag_value(aof[0]) is None):
        raise StoreError("the Redis store URL's require_aof= must be one of true or false")
    return (urlunsplit(parts._replace(query=urlencode(kept))),
            int(buckets[0]) if buckets else None, flag_value(aof[0]) if aof else None)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise StoreError(f"unexpected reply from Redis: {type(value).__name__}")


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _optional_int(value: int | None) -> str:
    return "" if value is None else str(value)


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


def _wrong_type(exc: Exception) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")


def _status(reply: object, kind: str, record_id: str) -> tuple[str, str]:
    if not isinstance(reply, list) or len(reply) != 2:
        raise StoreError(f"unexpected script reply for {kind} {record_id!r}")
    return _text(reply[0]), _text(reply[1])


def _stored_state(state: str, kind: str, record_id: str) -> str:
    try:
        return check_state(state)
    except SagaValidationError as exc:
        raise InvalidRecordError(kind=kind, record_id=record_id) from exc


def _decimal(text: str | None, *, low: int) -> int | None:
    if text is None or not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    value = int(text)
    return value if low <= value <= MAX_SAFE_INTEGER else None


_FIELDS = {"id", "version", "state", "updated_at_ms", "body", "label", "due_at_ms", "nn"}


def _parse_record(kind: str, record_id: str, fields: Mapping[Any, Any]) -> Envelope:
    """Turn a record hash into an envelope, or raise ``InvalidRecordError``."""
    fail = InvalidRecordError(kind=kind, record_id=record_id)
    try:
        text = {_text(name): _text(value) for name, value in fields.items()}
    except (UnicodeDecodeError, StoreError) as exc:
        raise fail from exc
    version = _decimal(text.get("version"), low=1)
    updated = _decimal(text.get("updated_at_ms"), low=0)
    if text.get("id") != record_id or "body" not in text or version is None or updated is None:
        raise fail
    state = _stored_state(text.get("state", ""), kind, record_id)
    due = text.get("due_at_ms")
    due_at = None if due is None else _decimal(due, low=0)
    if due is not None and due_at is None:
        raise fail
    return Envelope(kind, record_id, version, state, updated, text["body"], text.get("label"),
                    due_at, _notes(text, fail))


def _notes(text: Mapping[str, str], fail: InvalidRecordError) -> tuple[str, ...]:
    count = _decimal(text.get("nn", "0"), low=0)
    if count is None or count > MAX_NOTES:
        raise fail
    try:
        notes = tuple(text[f"n:{i}"] for i in range(1, count + 1))
    except KeyError:
        raise fail from None
    if len(text) != len(_FIELDS & text.keys()) + count:
        raise fail  # a field no version of the store writes
    return notes


def _from_position(rows: list[tuple[int, str]], at: tuple[int, str] | None, newest_first: bool
                   ) -> list[tuple[int, str]]:
    """The rows at or past ``at`` in the walk's direction."""
    if at is None:
        return rows
    return [r for r in rows if (r <= at if newest_first else r >= at)]


def _passed(
    envelope: Envelope,
    bucket: int,
    still: Callable[[Envelope], tuple[int, int] | None],
    following: _Position | None,
) -> bool:
    """True if ``envelope`` still matches the walk at a position before ``following``."""
    where = still(envelope)
    if where is None:
        return False
    position = (where[0], bucket, where[1], envelope.id)
    return following is None or position < following


def _scanned(kind: str, state: str, score: int, record_id: str, fields: object) -> Envelope | None:
    """The envelope of one index entry as fetched: None if the record is gone (deleted since
    its entry was read: scripts remove both at once), a placeholder if it is corrupt."""
    placeholder = Envelope(kind, record_id, 0, state, score, "")
    if isinstance(fields, ResponseError) and _wrong_type(fields):
        return placeholder
    if isinstance(fields, (RedisError, RedisClusterException)):
        raise StoreError(
            f"redis scan failed: {type(fields).__name__}: {redact_text(str(fields))}"
        ) from fields
    if isinstance(fields, Mapping) and not fields:
        return None
    if isinstance(fields, SagaValidationError) or not isinstance(fields, Mapping):
        return placeholder
    try:
        return _parse_record(kind, record_id, fields)
    except InvalidRecordError:
        return placeholder
