"""RedisStore against a real Redis: atomicity, robustness, cost.

The shared contract runs from test_conformance.py; this file proves what only Redis can get
wrong: scripts reloaded after SCRIPT FLUSH and restarts, corrupt hashes, validation before any
key is built, exact-once races, and scan cost. The ``TestMarshallingOnFakeRedis`` class uses
fakeredis and checks only Python <-> Redis marshalling, never that a script is right.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_sagas.errors import FencedWriteRefused, InvalidRecordError, SagaValidationError, StoreError
from celery_sagas.stores._cursor import encode_cursor
from celery_sagas.stores.base import Envelope, Fence, Lease, Store
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.redis._keys import KeyLayout
from celery_sagas.stores.redis._scripts import RECORD_SCRIPTS, SCRIPT_NAMES, Scripts, script_text
from celery_sagas.testing.racing import race
from tests import processes

T0 = 1_700_000_000_000
THREADS = 16
REQUIRE = os.environ.get("CELERY_SAGAS_REQUIRE_SERVICES") == "1"


# ====================================================================== helpers and fixtures


def envelope(
    record_id: str, state: str = "running", at: int = T0, *, version: int = 1, body: str = ""
) -> Envelope:
    return Envelope("saga", record_id, version, state, at, body or f'{{"id":"{record_id}"}}')


def bump(current: Envelope, **changes: Any) -> Envelope:
    return replace(current, version=current.version + 1, **changes)


def wipe(client: redis.Redis, prefix: str) -> None:
    found = list(client.scan_iter(match=KeyLayout(prefix).pattern(), count=1000))
    if found:
        client.delete(*found)


def prefix_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=KeyLayout(prefix).pattern(), count=1000))


class CommandLog:
    """Every command a client sends (pipelined ones included), as text tuples."""

    # INFO: the persistence check of a store's first use (test_durability.py)
    HANDSHAKE = frozenset({"CLIENT", "HELLO", "AUTH", "SELECT", "PING", "INFO"})

    def __init__(self) -> None:
        self.commands: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def record(self, args: tuple[Any, ...]) -> None:
        text = tuple(a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a) for a in args)
        if text and text[0].upper() not in self.HANDSHAKE:
            with self._lock:
                self.commands.append(text)

    def named(self, name: str) -> list[tuple[str, ...]]:
        return [c for c in self.commands if c[0].upper() == name]

    def script_runs(self) -> int:
        """EVALSHA calls, not counting the repeat after a NOSCRIPT reload (SCRIPT LOAD)."""
        loads = [c for c in self.named("SCRIPT") if c[1].upper() == "LOAD"]
        return len(self.named("EVALSHA")) - len(loads)

    def clear(self) -> None:
        self.commands.clear()


def counting_client(url: str, log: CommandLog, **options: Any) -> redis.Redis:
    class Counting(redis.Connection):
        def send_command(self, *args: Any, **kwargs: Any) -> None:
            log.record(args)
            super().send_command(*args, **kwargs)

        def pack_commands(self, commands: Any) -> Any:
            for command in commands:
                log.record(tuple(command))
            return super().pack_commands(commands)

    pool = redis.ConnectionPool.from_url(url, connection_class=Counting, **options)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


@pytest.fixture
def raw(redis_url: str, unique_prefix: str) -> Iterator[redis.Redis]:
    """A plain client on the test database; removes the prefix's keys afterwards."""
    client = redis.Redis.from_url(redis_url)
    yield client
    wipe(client, unique_prefix)
    client.close()


@pytest.fixture
def rstore(redis_url: str, unique_prefix: str, raw: redis.Redis) -> Iterator[RedisStore]:
    store = RedisStore.from_url(redis_url, prefix=unique_prefix, require_aof=False)
    yield store
    store.close()


@pytest.fixture
def log() -> CommandLog:
    return CommandLog()


@pytest.fixture
def counted(redis_url: str, unique_prefix: str, raw: redis.Redis, log: CommandLog) -> Iterator[RedisStore]:
    """A store whose every command lands in ``log``."""
    store = RedisStore(counting_client(redis_url, log), prefix=unique_prefix, require_aof=False)
    yield store
    store._client.close()




def scan_all(store: Store, states: list[str], *, limit: int, before: int | None = None) -> list[Envelope]:
    found: list[Envelope] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = store.scan("saga", states, updated_before_ms=before, cursor=cursor, limit=limit)
        assert len(page.items) <= limit
        found.extend(page.items)
        cursor = page.cursor
        if cursor is None:
            return found
    raise AssertionError("scan never ended")


# ====================================================================== scripts (static)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_opens_with_a_contract_header_naming_every_key_and_argument(name: str) -> None:
    text = script_text(name)
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    assert text.startswith(f"-- {name}:")
    assert "Returns" in header
    for used in set(re.findall(r"(KEYS|ARGV)\[(\d+)\]", body)):
        assert re.search(rf"^-- {used[0]}\[{used[1]}\]", header, re.M), f"{name}: {used} undocumented"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_scripts_touch_only_keys_passed_in_keys(name: str) -> None:
    body = "\n".join(line for line in script_text(name).splitlines() if not line.startswith("--"))
    # _record.lua's functions call on the key they are given: each call of them must give KEYS[n]
    given = {"lease", "key"} if name in RECORD_SCRIPTS else set()
    calls = re.findall(r"redis\.call\('(\w+)',\s*([^,)]+)", body)
    assert calls
    for command, first in calls:
        assert command.upper() not in {"KEYS", "SCAN", "EVAL", "EVALSHA"}
        assert re.fullmatch(r"KEYS\[\d\]", first.strip()) or first.strip() in given, \
            f"{name}: {command} on {first}"
    for first in re.findall(r"(?<!function )\b(?:fence_refusal|not_a_record)\(([^,)]+)", body):
        assert re.fullmatch(r"KEYS\[\d\]", first.strip()), f"{name}: a check of {first}"
    assert "unpack" not in body


# ====================================================================== records


@pytest.mark.redis
def test_create_inserts_once_and_get_returns_the_same_envelope(rstore: RedisStore) -> None:
    first = envelope("order-1", body='{"text":"caf\u00e9 \U0001f600"}')
    assert rstore.create(first) is True
    assert rstore.create(replace(first, body='{"other":1}')) is False
    assert rstore.get("saga", "order-1") == first
    assert rstore.get("saga", "order-2") is None
    assert rstore.get("effect", "order-1") is None


@pytest.mark.redis
def test_a_retried_identical_cas_reports_true_and_a_different_one_false(rstore: RedisStore) -> None:
    first = envelope("order-1")
    rstore.create(first)
    second = bump(first, state="compensating", updated_at_ms=T0 + 1, body='{"n":2}')
    assert rstore.compare_and_set(second, 1) is True
    assert rstore.compare_and_set(second, 1) is True
    assert rstore.compare_and_set(replace(second, body='{"n":"other"}'), 1) is False
    assert rstore.get("saga", "order-1") == second


@pytest.mark.redis
def test_cas_moves_the_record_between_state_indexes(rstore: RedisStore, raw: redis.Redis) -> None:
    first = envelope("order-1")
    rstore.create(first)
    done = bump(first, state="completed", updated_at_ms=T0 + 5)
    assert rstore.compare_and_set(done, 1) is True
    layout = rstore.layout
    assert raw.zscore(layout.record_index("saga", "order-1", "running"), "order-1") is None
    assert raw.zscore(layout.record_index("saga", "order-1", "completed"), "order-1") == T0 + 5
    assert rstore.scan("saga", ["running"]).items == ()
    assert rstore.scan("saga", ["completed"]).items == (done,)


@pytest.mark.redis
def test_a_store_that_never_saw_the_record_still_moves_it_between_indexes(
    redis_url: str, unique_prefix: str, rstore: RedisStore, raw: redis.Redis, log: CommandLog
) -> None:
    """Given another process wrote version 1, when this one CASes to a new state, then both
    indexes are right: the script refused the wrong old index and the store asked again."""
    rstore.create(envelope("order-1"))
    other = RedisStore(counting_client(redis_url, log), prefix=unique_prefix, require_aof=False)
    moved = bump(envelope("order-1"), state="compensating", updated_at_ms=T0 + 1)
    assert other.compare_and_set(moved, 1) is True
    assert log.script_runs() == 2
    assert raw.zcard(rstore.layout.record_index("saga", "order-1", "running")) == 0
    assert rstore.scan("saga", ["compensating"]).items == (moved,)
    other._client.close()


@pytest.mark.redis
def test_a_step_write_after_a_read_is_one_round_trip(counted: RedisStore, log: CommandLog) -> None:
    counted.create(envelope("order-1"))
    log.clear()
    current = counted.get("saga", "order-1")
    assert current is not None
    assert counted.compare_and_set(bump(current, state="completed", updated_at_ms=T0 + 1), 1) is True
    assert len(log.named("HGETALL")) == 1 and log.script_runs() == 1


@pytest.mark.redis
@pytest.mark.parametrize("new_version", [1, 3])
def test_cas_with_a_wrong_new_version_raises_before_any_command(
    counted: RedisStore, log: CommandLog, new_version: int
) -> None:
    counted.create(envelope("order-1"))
    log.clear()
    with pytest.raises(SagaValidationError):
        counted.compare_and_set(envelope("order-1", version=new_version), 1)
    assert log.commands == []


# ====================================================================== fences and leases


@pytest.mark.redis
def test_a_write_under_an_older_grant_is_refused_and_changes_nothing(rstore: RedisStore) -> None:
    first = envelope("order-1")
    rstore.create(first)
    bucket = rstore.bucket_of("order-1")
    old = rstore.acquire_lease("sweep", "a", "tok-a", T0, 1000, bucket=bucket)
    assert old is not None and old.fence == 1
    new = rstore.acquire_lease("sweep", "b", "tok-b", T0 + 1000, 1000, bucket=bucket)
    assert new is not None and new.fence == 2
    with pytest.raises(FencedWriteRefused) as refused:
        rstore.compare_and_set(bump(first, updated_at_ms=T0 + 1), 1, fence=Fence.of(old))
    assert refused.value.lease == "sweep" and refused.value.fence == 1
    assert rstore.get("saga", "order-1") == first
    assert rstore.compare_and_set(bump(first, updated_at_ms=T0 + 2), 1, fence=Fence.of(new)) is True


@pytest.mark.redis
def test_a_fence_on_a_never_granted_lease_is_accepted(rstore: RedisStore) -> None:
    rstore.create(envelope("order-1"))
    fence = Fence("never", 0, rstore.bucket_of("order-1"))
    assert rstore.compare_and_set(bump(envelope("order-1")), 1, fence=fence) is True


@pytest.mark.redis
def test_fences_strictly_increase_across_expiry_and_release_and_the_cursor_survives(
    rstore: RedisStore,
) -> None:
    first = rstore.acquire_lease("sweep", "a", "tok-1", T0, 100)
    assert first is not None and first.cursor is None
    assert rstore.acquire_lease("sweep", "b", "tok-2", T0 + 99, 100) is None
    assert rstore.checkpoint_lease(first, "page-7", T0 + 50) is True
    second = rstore.acquire_lease("sweep", "b", "tok-2", T0 + 100, 100)  # first expired
    assert second is not None and second.fence == 2 and second.cursor == "page-7"
    assert rstore.release_lease(second) is True
    third = rstore.acquire_lease("sweep", "c", "tok-3", T0 + 101, 100)
    assert third is not None and third.fence == 3 and third.cursor == "page-7"
    assert rstore.checkpoint_lease(third, None, T0 + 102) is True
    assert rstore.release_lease(third) is True
    fourth = rstore.acquire_lease("sweep", "d", "tok-4", T0 + 103, 100)
    assert fourth is not None and fourth.fence == 4 and fourth.cursor is None


@pytest.mark.redis
def test_renew_checkpoint_and_release_need_owner_token_and_time(rstore: RedisStore) -> None:
    lease = rstore.acquire_lease("sweep", "a", "tok-1", T0, 100)
    assert lease is not None
    thief = Lease("sweep", "a", "tok-2", lease.expires_at_ms, lease.fence)
    impostor = Lease("sweep", "b", "tok-1", lease.expires_at_ms, lease.fence)
    for wrong in (thief, impostor):
        assert rstore.renew_lease(wrong, T0 + 1, 100) is None
        assert rstore.checkpoint_lease(wrong, "x", T0 + 1) is False
        assert rstore.release_lease(wrong) is False
    renewed = rstore.renew_lease(lease, T0 + 50, 100)
    assert renewed == replace(lease, expires_at_ms=T0 + 150)
    assert rstore.renew_lease(lease, T0 + 150, 100) is None  # expired at 150
    assert rstore.checkpoint_lease(lease, "x", T0 + 150) is False
    assert rstore.release_lease(lease) is True  # releasing an expired grant is allowed
    assert rstore.release_lease(lease) is False


@pytest.mark.redis
def test_no_script_reply_ever_carries_the_stored_token(rstore: RedisStore, raw: redis.Redis) -> None:
    secret = "s3cret-token-value"
    assert rstore.acquire_lease("sweep", "a", secret, T0, 100) is not None
    scripts = Scripts.register(raw)
    key = rstore.layout.lease("sweep", 0)
    replies = [
        scripts.acquire_lease([key], ["b", "t", T0, T0 + 1]),
        scripts.renew_lease([key], ["a", secret, T0 + 1, T0 + 200]),
        scripts.renew_lease([key], ["a", "guess", T0 + 1, T0 + 200]),
        scripts.checkpoint_lease([key], ["a", secret, T0 + 2, "1", "c"]),
        scripts.release_lease([key], ["a", secret]),
    ]
    assert secret.encode() not in repr(replies).encode()


@pytest.mark.redis
def test_lease_times_are_validated_before_any_command(counted: RedisStore, log: CommandLog) -> None:
    for now, duration in [(-1, 10), (T0, 0), (T0, -5), (T0, 1.5), (True, 10), (2**53 - 1, 10)]:
        with pytest.raises(SagaValidationError):
            counted.acquire_lease("sweep", "a", "tok", now, duration)  # type: ignore[arg-type]
    assert log.commands == []


# ====================================================================== validation first


BAD_IDS = ["has space", "new\nline", "ctrl\x01", "nul\x00", "x" * 10_000, ""]


@pytest.mark.redis
@pytest.mark.parametrize("name", ["{brace", "brace}", "a{b}c"])
def test_a_lease_name_with_braces_is_refused_before_any_key_is_built(
    counted: RedisStore, log: CommandLog, name: str
) -> None:
    # a lease name sits inside the hash tag, where a brace would end it early
    with pytest.raises(SagaValidationError):
        counted.acquire_lease(name, "owner", "tok", T0, 10)
    with pytest.raises(SagaValidationError):
        counted.compare_and_set(envelope("ok", version=2), 1, fence=Fence(name, 1))
    assert log.commands == []


@pytest.mark.redis
def test_an_id_with_braces_stays_in_its_bucket_hash_tag(
    counted: RedisStore, raw: redis.Redis, unique_prefix: str
) -> None:
    record_id = "{other-tag}:x}"
    assert counted.create(envelope(record_id)) is True
    [key] = (k.decode() for k in raw.keys(f"{{{unique_prefix}:*:r:*"))
    layout = counted.layout
    tag = layout.tag(layout.bucket(record_id))
    assert key == f"{tag}:r:saga:{record_id}"
    assert key[: key.index("}") + 1] == tag  # what Redis Cluster hashes


@pytest.mark.redis
@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda s: repr(s[:12]))
def test_bad_ids_are_refused_before_any_key_is_built(
    counted: RedisStore, log: CommandLog, raw: redis.Redis, unique_prefix: str, bad: str
) -> None:
    with pytest.raises(SagaValidationError):
        counted.create(envelope(bad))
    with pytest.raises(SagaValidationError):
        counted.get("saga", bad)
    with pytest.raises(SagaValidationError):
        counted.compare_and_set(envelope(bad, version=2), 1)
    with pytest.raises(SagaValidationError):
        counted.create(envelope("ok", state=bad or "a b"))
    with pytest.raises(SagaValidationError):
        counted.scan("saga", [bad or "a b"])
    with pytest.raises(SagaValidationError):
        counted.acquire_lease(bad, "owner", "tok", T0, 10)
    with pytest.raises(SagaValidationError):
        counted.compare_and_set(envelope("ok", version=2), 1, fence=Fence(bad, 1))
    assert log.commands == []
    assert prefix_keys(raw, unique_prefix) == []


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["Saga", "sa ga", "", "k" * 40, "{saga}"])
def test_bad_kinds_are_refused_before_any_command(counted: RedisStore, log: CommandLog, kind: str) -> None:
    with pytest.raises(SagaValidationError):
        counted.get(kind, "order-1")
    with pytest.raises(SagaValidationError):
        counted.create(replace(envelope("order-1"), kind=kind))
    assert log.commands == []


@pytest.mark.parametrize("prefix", ["{p}", "a b", "", "x" * 65])
def test_from_url_refuses_a_bad_prefix_before_connecting(prefix: str) -> None:
    with pytest.raises(SagaValidationError):
        RedisStore.from_url("redis://127.0.0.1:1/0", prefix=prefix)


def test_from_url_turns_a_bad_url_into_a_store_error_without_the_password() -> None:
    with pytest.raises(StoreError) as failed:
        RedisStore.from_url("http://user:hunter2@example.invalid/0")
    assert "hunter2" not in str(failed.value)


# ====================================================================== corrupt data


@pytest.mark.redis
@pytest.mark.parametrize(
    "damage",
    [
        "string",
        "list",
        "missing-body",
        "version-text",
        "version-zero",
        "version-float",
        "updated-negative",
        "other-id",
        "bad-state",
        "binary-body",
    ],
)
def test_a_corrupt_record_raises_invalid_record_error_from_get_and_cas(
    rstore: RedisStore, raw: redis.Redis, damage: str
) -> None:
    rstore.create(envelope("order-1"))
    key = rstore.layout.record("saga", "order-1")
    if damage == "string":
        raw.delete(key)
        raw.set(key, "garbage")
    elif damage == "list":
        raw.delete(key)
        raw.rpush(key, "garbage")
    elif damage == "missing-body":
        raw.hdel(key, "body")
    else:
        field, value = {
            "version-text": ("version", "abc"),
            "version-zero": ("version", "0"),
            "version-float": ("version", "1.0"),
            "updated-negative": ("updated_at_ms", "-5"),
            "other-id": ("id", "order-2"),
            "bad-state": ("state", "bad state"),
            "binary-body": ("body", b"\xff\xfe"),
        }[damage]
        raw.hset(key, field, value)
    with pytest.raises(InvalidRecordError) as from_get:
        rstore.get("saga", "order-1")
    assert (from_get.value.kind, from_get.value.record_id) == ("saga", "order-1")
    if damage not in ("updated-negative", "bad-state", "binary-body"):  # CAS replaces those fields
        with pytest.raises(InvalidRecordError) as from_cas:
            rstore.compare_and_set(envelope("order-1", version=2, at=T0 + 1), 1)
        assert (from_cas.value.kind, from_cas.value.record_id) == ("saga", "order-1")
    assert rstore.create(envelope("order-1")) is False


@pytest.mark.redis
def test_scan_reports_a_corrupt_record_as_a_placeholder_and_goes_on(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    """A sweep must not be blocked forever by one bad record: decoding the placeholder raises
    InvalidRecordError naming it, the other records still come back."""
    for n in range(3):
        rstore.create(envelope(f"order-{n}", at=T0 + n))
    raw.hset(rstore.layout.record("saga", "order-1"), "version", "garbage")
    items = rstore.scan("saga", ["running"]).items
    assert [(e.id, e.version) for e in sorted(items, key=lambda e: e.id)] == [
        ("order-0", 1),
        ("order-1", 0),
        ("order-2", 1),
    ]
    placeholder = next(e for e in items if e.id == "order-1")
    assert placeholder.body == "" and placeholder.state == "running" and placeholder.updated_at_ms == T0 + 1


@pytest.mark.redis
def test_a_corrupt_fence_counter_is_a_store_error_and_writes_nothing(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    first = envelope("order-1")
    rstore.create(first)
    bucket = rstore.bucket_of("order-1")
    raw.hset(rstore.layout.lease("sweep", bucket), "fence", "not-a-number")
    with pytest.raises(StoreError):
        rstore.compare_and_set(bump(first), 1, fence=Fence("sweep", 1, bucket))
    with pytest.raises(StoreError):
        rstore.acquire_lease("sweep", "a", "tok", T0, 10, bucket=bucket)
    assert rstore.get("saga", "order-1") == first
    assert raw.hget(rstore.layout.lease("sweep", bucket), "owner") is None


# ====================================================================== races


@pytest.mark.redis
def test_sixteen_racing_cas_writers_exactly_one_wins(rstore: RedisStore) -> None:
    first = envelope("order-1")
    rstore.create(first)
    results = race(lambda i: rstore.compare_and_set(bump(first, body=f'{{"writer":{i}}}'), 1))
    assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
    stored = rstore.get("saga", "order-1")
    assert stored is not None and stored.body == f'{{"writer":{results.index(True)}}}'
    assert len(rstore.scan("saga", ["running"]).items) == 1


@pytest.mark.redis
def test_sixteen_racing_state_changes_leave_exactly_one_index_entry(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    first = envelope("order-1")
    rstore.create(first)
    states = ["running", "compensating", "completed", "manual-review"]
    results = race(lambda i: rstore.compare_and_set(bump(first, state=states[i % 4], body=f'{{"w":{i}}}'), 1))
    assert results.count(True) == 1
    stored = rstore.get("saga", "order-1")
    assert stored is not None
    entries = {s: raw.zscore(rstore.layout.record_index("saga", "order-1", s), "order-1") for s in states}
    assert {s for s, score in entries.items() if score is not None} == {stored.state}


@pytest.mark.redis
def test_sixteen_racing_creators_exactly_one_inserts(rstore: RedisStore) -> None:
    results = race(lambda i: rstore.create(envelope("order-1", body=f'{{"creator":{i}}}')))
    assert results.count(True) == 1 and results.count(False) == THREADS - 1


@pytest.mark.redis
def test_sixteen_racing_lease_takers_exactly_one_gets_it(rstore: RedisStore) -> None:
    results = race(lambda i: rstore.acquire_lease("sweep", f"w{i}", f"tok-{i}", T0, 1000))
    granted = [r for r in results if r is not None]
    assert len(granted) == 1 and granted[0].fence == 1, results


# ====================================================================== scan


@pytest.mark.redis
def test_scan_pages_return_each_matching_record_exactly_once(rstore: RedisStore) -> None:
    """Records spread over buckets and states with many equal timestamps (ties by id)."""
    expected: dict[str, set[str]] = {"running": set(), "compensating": set(), "completed": set()}
    for n in range(240):
        state = ("running", "compensating", "completed")[n % 3]
        rstore.create(envelope(f"s-{n:03d}", state, at=T0 + n % 5))
        expected[state].add(f"s-{n:03d}")
    for limit in (1, 7, 100, 1000):
        found = scan_all(rstore, ["running", "compensating"], limit=limit)
        ids = [e.id for e in found]
        assert len(ids) == len(set(ids)) == 160, limit
        assert set(ids) == expected["running"] | expected["compensating"]


@pytest.mark.redis
def test_scan_orders_each_bucket_oldest_first_and_states_in_the_order_given(rstore: RedisStore) -> None:
    for n in range(60):
        rstore.create(envelope(f"s-{n:03d}", ("running", "compensating")[n % 2], at=T0 + (n * 7) % 11))
    found = scan_all(rstore, ["compensating", "running"], limit=5)
    states = [e.state for e in found]
    assert states == sorted(states)  # every compensating before every running
    layout = rstore.layout
    for state in ("compensating", "running"):
        for bucket in range(layout.buckets):
            positions = [
                (e.updated_at_ms, e.id) for e in found if e.state == state and layout.bucket(e.id) == bucket
            ]
            assert positions == sorted(positions)


@pytest.mark.redis
def test_updated_before_is_an_exclusive_bound(rstore: RedisStore) -> None:
    for n in range(10):
        rstore.create(envelope(f"s-{n}", at=T0 + n))
    found = scan_all(rstore, ["running"], limit=3, before=T0 + 4)
    assert sorted(e.id for e in found) == ["s-0", "s-1", "s-2", "s-3"]


@pytest.mark.redis
def test_the_last_full_page_ends_with_no_cursor(rstore: RedisStore) -> None:
    for n in range(6):
        rstore.create(envelope(f"s-{n}", at=T0 + n))
    first = rstore.scan("saga", ["running"], limit=3)
    assert len(first.items) == 3 and first.cursor is not None
    second = rstore.scan("saga", ["running"], cursor=first.cursor, limit=3)
    assert len(second.items) == 3 and second.cursor is None


@pytest.mark.redis
def test_records_written_between_pages_are_never_lost_and_only_they_may_repeat(rstore: RedisStore) -> None:
    for n in range(40):
        rstore.create(envelope(f"s-{n:02d}", at=T0 + n))
    page = rstore.scan("saga", ["running"], limit=20)
    seen = [e.id for e in page.items]
    rewritten = {e.id for e in page.items[::2]}
    for e in page.items[::2]:  # written again: a newer position in the same state
        assert rstore.compare_and_set(bump(e, updated_at_ms=T0 + 100), e.version) is True
    rest = scan_all_from(rstore, page.cursor)
    assert set(seen + rest) == {f"s-{n:02d}" for n in range(40)}
    repeated = {i for i in rest if i in seen}
    assert repeated <= rewritten
    assert len(rest) == len(set(rest))


def scan_all_from(store: Store, cursor: str | None) -> list[str]:
    ids: list[str] = []
    while cursor is not None:
        page = store.scan("saga", ["running"], cursor=cursor, limit=4)
        ids.extend(e.id for e in page.items)
        cursor = page.cursor
    return ids


@pytest.mark.redis
@pytest.mark.parametrize(
    "cursor",
    [
        "!!!",
        encode_cursor(["running"], "running", (T0, "x")),  # a cursor without a bucket
        encode_cursor(["running"], "running", (T0, "x"), 16),  # a bucket the layout lacks
        encode_cursor(["running"], "running", (T0, "x"), -1),
    ],
)
def test_a_malformed_cursor_is_refused(counted: RedisStore, log: CommandLog, cursor: str) -> None:
    with pytest.raises(SagaValidationError):
        counted.scan("saga", ["running"], cursor=cursor)
    assert log.commands == []


@pytest.mark.redis
def test_scan_cost_follows_matching_records_not_records_kept(
    counted: RedisStore, log: CommandLog, rstore: RedisStore, raw: redis.Redis
) -> None:
    """5,000 final records and 10 live ones: the scan never reads a final record or its index,
    issues one ZRANGE per (state, bucket) plus one per extra page, and fetches 10 records."""
    pipe = raw.pipeline(transaction=False)
    for n in range(5_000):
        pipe.hset(rstore.layout.record("saga", f"done-{n}"), mapping={"id": f"done-{n}", "version": 1})
        pipe.zadd(rstore.layout.record_index("saga", f"done-{n}", "completed"), {f"done-{n}": T0 + n})
    pipe.execute()
    for n in range(10):
        rstore.create(envelope(f"live-{n}", ("running", "compensating")[n % 2], at=T0 + n))
    states = ["running", "compensating", "manual-review"]
    buckets = counted.layout.buckets
    for limit, pages in ((100, 1), (3, 4)):
        log.clear()
        found = scan_all(counted, states, limit=limit)
        assert sorted(e.id for e in found) == [f"live-{n}" for n in range(10)]
        assert not [c for c in log.commands if any(":s:completed" in a or "done-" in a for a in c)]
        assert len(log.named("ZRANGE")) <= buckets * len(states) + pages
        assert len(log.named("HGETALL")) == 10
        assert {c[0].upper() for c in log.commands} == {"ZRANGE", "HGETALL"}


# ====================================================================== scripts reload, restarts


class PrivateRedis:
    """A redis-server of our own on a free loopback port, durable on every write."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if REQUIRE:
                pytest.fail("redis-server is not installed", pytrace=False)
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.directory = directory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)]
        self.process = processes.spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 15
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise
                time.sleep(0.02)
        finally:
            client.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self.process is not None:
            processes.forget(self.process)
        self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.mark.redis
def test_script_flush_between_calls_is_survived(private_redis: PrivateRedis) -> None:
    """SCRIPT FLUSH empties the server-wide script cache: it runs on a Redis of its own, so
    the flushes never race another test's EVALSHA on the shared server."""
    rstore = RedisStore.from_url(private_redis.url, prefix="flush")
    raw = redis.Redis.from_url(private_redis.url)
    first = envelope("order-1")
    rstore.create(envelope("order-0"))
    raw.script_flush()
    assert rstore.create(first) is True
    raw.script_flush()
    assert rstore.compare_and_set(bump(first, state="completed"), 1) is True
    raw.script_flush()
    lease = rstore.acquire_lease("sweep", "a", "tok", T0, 100)
    assert lease is not None
    for call in (
        lambda: rstore.renew_lease(lease, T0 + 1, 100),
        lambda: rstore.checkpoint_lease(lease, "c", T0 + 2),
        lambda: rstore.release_lease(lease),
    ):
        raw.script_flush()
        assert call()
    raw.close()
    rstore.close()


@pytest.mark.redis
def test_the_store_keeps_working_across_a_server_restart(private_redis: PrivateRedis) -> None:
    """Given a killed and restarted Redis (scripts cache empty, connections dead), the same
    store object reconnects and every primitive works on the data that survived."""
    store = RedisStore.from_url(private_redis.url, prefix="restart")
    first = envelope("order-1")
    assert store.create(first) is True
    lease = store.acquire_lease("sweep", "a", "tok-a", T0, 100)
    assert lease is not None and store.checkpoint_lease(lease, "page-3", T0 + 1)

    old_pid = private_redis.pid
    private_redis.kill()
    private_redis.start()
    assert private_redis.pid != old_pid
    check = redis.Redis.from_url(private_redis.url)
    assert check.script_exists(store._scripts.compare_and_set.sha) == [False]

    assert store.get("saga", "order-1") == first
    second = bump(first, state="completed", updated_at_ms=T0 + 5)
    assert store.compare_and_set(second, 1) is True
    assert check.script_exists(store._scripts.compare_and_set.sha) == [True]
    check.close()
    assert store.scan("saga", ["completed"]).items == (second,)
    taken = store.acquire_lease("sweep", "b", "tok-b", T0 + 200, 100)
    assert taken is not None and taken.fence == 2 and taken.cursor == "page-3"
    store.close()


@pytest.mark.redis
def test_a_server_that_is_down_raises_store_error_from_every_primitive(private_redis: PrivateRedis) -> None:
    store = RedisStore.from_url(
        private_redis.url, prefix="down", retry=Retry(NoBackoff(), 1), socket_connect_timeout=0.5
    )
    store.create(envelope("order-1"))
    private_redis.kill()
    lease = Lease("sweep", "a", "tok", T0 + 10, 1)
    calls: list[Callable[[], object]] = [
        lambda: store.create(envelope("order-2")),
        lambda: store.get("saga", "order-1"),
        lambda: store.compare_and_set(bump(envelope("order-1")), 1),
        lambda: store.scan("saga", ["running"]),
        lambda: store.acquire_lease("sweep", "a", "tok", T0, 10),
        lambda: store.renew_lease(lease, T0, 10),
        lambda: store.checkpoint_lease(lease, None, T0),
        lambda: store.release_lease(lease),
    ]
    for call in calls:
        with pytest.raises(StoreError) as failed:
            call()
        assert isinstance(failed.value.__cause__, redis.RedisError)
    store.close()


# ====================================================================== clients


@pytest.mark.redis
def test_a_decoding_client_works_too(redis_url: str, unique_prefix: str, raw: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = RedisStore(client, prefix=unique_prefix, require_aof=False)
    first = envelope("order-1", body='{"t":"\u65e5\u672c"}')
    assert store.create(first) is True
    assert store.get("saga", "order-1") == first
    assert store.scan("saga", ["running"]).items == (first,)
    lease = store.acquire_lease("sweep", "a", "tok", T0, 10)
    assert lease is not None and store.checkpoint_lease(lease, "c", T0)
    assert store.renew_lease(lease, T0 + 1, 10) == replace(lease, expires_at_ms=T0 + 11, cursor="c")
    raw.hset(store.layout.record("saga", "order-1"), "body", b"\xff")
    with pytest.raises(InvalidRecordError):
        store.get("saga", "order-1")
    store.close()
    assert client.ping()  # close() leaves a client it did not open alone
    client.close()


@pytest.mark.redis
def test_close_closes_the_pool_that_from_url_opened(
    redis_url: str, unique_prefix: str, raw: redis.Redis
) -> None:
    store = RedisStore.from_url(redis_url, prefix=unique_prefix, require_aof=False)
    store.create(envelope("order-1"))
    pool = store._client.connection_pool
    assert pool._created_connections >= 1  # type: ignore[attr-defined]
    store.close()
    assert not any(c._sock for c in pool._available_connections)  # type: ignore[attr-defined]


def test_the_store_satisfies_the_store_protocol() -> None:
    assert isinstance(RedisStore(fakeredis.FakeRedis()), Store)


# ====================================================================== fakeredis: marshalling only


class TestMarshallingOnFakeRedis:
    """fakeredis (Lua 5.4 via lupa) checks how values cross the wire, never script correctness."""

    @pytest.fixture
    def fake(self) -> RedisStore:
        return RedisStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()), prefix="fake", buckets=4)

    def test_extreme_envelope_values_round_trip(self, fake: RedisStore) -> None:
        big = Envelope("saga", "x" * 255, 2**53 - 1, "s" * 64, 2**53 - 1, '{"t":"\U0001f600\u00e9"}')
        small = Envelope("effect", "!", 1, "-", 0, "[]")
        for item in (big, small):
            assert fake.create(item) is True
            assert fake.get(item.kind, item.id) == item
        assert fake.scan("saga", ["s" * 64]).items == (big,)

    def test_lease_cursor_none_and_empty_string_stay_distinct(self, fake: RedisStore) -> None:
        lease = fake.acquire_lease("sweep", "a", "tok", T0, 10)
        assert lease is not None and lease.cursor is None and lease.fence == 1
        assert fake.checkpoint_lease(lease, "", T0 + 1) is True
        renewed = fake.renew_lease(lease, T0 + 2, 10)
        assert renewed is not None and renewed.cursor == "" and renewed.fence == 1
        assert fake.release_lease(lease) is True
        again = fake.acquire_lease("sweep", "b", "tok2", T0 + 3, 10)
        assert again is not None and again.cursor == "" and again.fence == 2

    def test_integer_arguments_are_sent_as_exact_decimals(self, fake: RedisStore) -> None:
        first = Envelope("saga", "n", 9, "running", 1_699_999_999_999, "{}")
        assert fake.create(first) is True
        fields = fake._client.hgetall(fake.layout.record("saga", "n"))
        assert fields[b"version"] == b"9" and fields[b"updated_at_ms"] == b"1699999999999"


# ====================================================================== id index (PrefixScan)


def test_index_ids_backfills_records_written_before_the_id_index(
        rstore: RedisStore, raw: redis.Redis, unique_prefix: str) -> None:
    for n in range(30):
        assert rstore.create(envelope(f"old-{n:02d}", "running" if n % 2 else "completed"))
    layout = KeyLayout(unique_prefix)
    raw.delete(*(layout.ids("saga", b) for b in range(layout.buckets)))  # as before the index
    assert rstore.scan_prefix("saga", "old-", ["running", "completed"]).items == ()
    assert rstore.index_ids("saga", ["running", "completed"]) == 30
    assert rstore.index_ids("saga", ["running", "completed"]) == 0  # idempotent
    page = rstore.scan_prefix("saga", "old-1", ["running"], limit=100)
    assert [e.id for e in page.items] == [f"old-{n}" for n in range(11, 20, 2)]


def test_index_ids_backfills_the_creation_index_at_the_last_write(
        rstore: RedisStore, raw: redis.Redis, unique_prefix: str) -> None:
    made = [envelope(f"born-{n:02d}", "running", at=T0 + n) for n in range(6)]
    for each in made:
        assert rstore.create(each)
    assert rstore.compare_and_set(replace(made[0], version=2, updated_at_ms=T0 + 50), 1)
    layout = KeyLayout(unique_prefix)
    raw.delete(*(layout.created("saga", b) for b in range(layout.buckets)))  # as before it
    assert rstore.scan_ordered("saga", ["running"], by="created").items == ()
    assert rstore.index_ids("saga", ["running"]) == 6
    assert rstore.index_ids("saga", ["running"]) == 0  # idempotent
    page = rstore.scan_ordered("saga", ["running"], by="created", limit=100)
    assert [e.id for e in page.items] == [f"born-{n:02d}" for n in (1, 2, 3, 4, 5, 0)]


def test_a_created_page_of_rare_states_reads_on_and_skips_records_gone(
        rstore: RedisStore, raw: redis.Redis, unique_prefix: str) -> None:
    for n in range(40):
        assert rstore.create(envelope(f"mix-{n:02d}", "running" if n % 10 == 0 else "completed",
                                      at=T0 + n))
    layout = KeyLayout(unique_prefix)
    raw.delete(layout.record("saga", "mix-10"))  # an entry whose record is gone
    page = rstore.scan_ordered("saga", ["running"], by="created", limit=2)
    # a page reads at most 8 rounds of limit + 1 entries: short, with a cursor going on
    assert [e.id for e in page.items] == ["mix-00"] and page.cursor is not None
    rest = rstore.scan_ordered("saga", ["running"], by="created", cursor=page.cursor, limit=2)
    assert [e.id for e in rest.items] == ["mix-20", "mix-30"]
    whole = rstore.scan_ordered("saga", ["running"], by="created", limit=10, newest_first=True)
    assert [e.id for e in whole.items] == ["mix-30", "mix-20", "mix-00"]


def test_a_prefix_scan_page_of_rare_matches_reads_on_until_full(rstore: RedisStore) -> None:
    for n in range(40):
        assert rstore.create(envelope(f"mix-{n:02d}", "running" if n % 10 == 0 else "completed"))
    page = rstore.scan_prefix("saga", "mix-", ["running"], limit=3)
    assert [e.id for e in page.items] == ["mix-00", "mix-10", "mix-20"]
    rest = rstore.scan_prefix("saga", "mix-", ["running"], cursor=page.cursor, limit=3)
    assert [e.id for e in rest.items] == ["mix-30"] and rest.cursor is None
