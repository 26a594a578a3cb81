"""RedisStore scans under concurrent writes: a record that keeps matching is never skipped.

A Redis scan is not one atomic read: it reads index ranges (ZRANGE) and then the records
(a pipeline of HGETALL). These tests put a write from another client exactly between two of
those reads and check that every record that matched the whole time is still returned.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from celery_sagas.stores.base import Envelope
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.redis._keys import KeyLayout

T0 = 1_700_000_000_000

pytestmark = pytest.mark.redis


def _envelope(record_id: str, at_ms: int) -> Envelope:
    return Envelope("saga", record_id, 1, "running", at_ms, f'{{"id":"{record_id}"}}')


@pytest.fixture
def stores(redis_url: str, unique_prefix: str) -> Iterator[tuple[RedisStore, RedisStore]]:
    """A scanning store and a writing store on one bucket of a fresh prefix."""
    scanner = RedisStore.from_url(redis_url, prefix=unique_prefix, buckets=1, require_aof=False)
    writer = RedisStore.from_url(redis_url, prefix=unique_prefix, buckets=1, require_aof=False)
    yield scanner, writer
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=KeyLayout(unique_prefix).pattern(), count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    scanner.close()
    writer.close()


def _scan_ids(store: RedisStore, limit: int) -> list[str]:
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        page = store.scan("saga", ["running"], cursor=cursor, limit=limit)
        seen.extend(envelope.id for envelope in page.items)
        if page.cursor is None:
            return seen
        cursor = page.cursor
    raise AssertionError("scan never ended")


def test_a_record_rewritten_between_index_read_and_fetch_to_a_passed_position_is_returned(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    # given: four running records; the first page (limit 3) reads a, x, b from the index
    scanner, writer = stores
    a, x, b, c = (_envelope(name, T0 + at) for name, at in [("a", 0), ("x", 10), ("b", 20), ("c", 30)])
    for envelope in (a, x, b, c):
        assert writer.create(envelope) is True
    fetch = scanner._fetch
    calls = [0]

    def fetch_after_a_write(kind: str, record_ids: list[str]) -> list[object]:
        calls[0] += 1
        if calls[0] == 1:
            # when: x is written again (still running) to a position the next page starts after
            assert writer.compare_and_set(replace(x, version=2, updated_at_ms=T0 + 15), 1) is True
        return fetch(kind, record_ids)

    scanner._fetch = fetch_after_a_write  # type: ignore[method-assign]
    seen = _scan_ids(scanner, limit=3)
    # then: x, running throughout, is returned (at its new state), as are the others
    assert set(seen) == {"a", "x", "b", "c"}, seen


def test_a_record_leaving_a_tie_group_between_two_index_reads_skips_nothing(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    # given: ten records tied at one millisecond and two later ones
    scanner, writer = stores
    tied = [_envelope(f"t{i:02d}", T0) for i in range(10)]
    later = [_envelope("u1", T0 + 1), _envelope("u2", T0 + 2)]
    for envelope in tied + later:
        assert writer.create(envelope) is True
    first = scanner.scan("saga", ["running"], limit=4)
    assert [e.id for e in first.items] == ["t00", "t01", "t02", "t03"] and first.cursor is not None
    zrange = scanner._client.zrange
    calls = [0]

    def zrange_after_a_write(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        rows = zrange(*args, **kwargs)
        if calls[0] == 1:
            # when: between the two reads of the tie group, t00 (already returned) moves on
            assert writer.compare_and_set(replace(tied[0], version=2, updated_at_ms=T0 + 100), 1)
        return rows

    scanner._client.zrange = zrange_after_a_write  # type: ignore[method-assign]
    seen: list[str] = []
    cursor: str | None = first.cursor
    while cursor is not None:
        page = scanner.scan("saga", ["running"], cursor=cursor, limit=4)
        seen.extend(envelope.id for envelope in page.items)
        cursor = page.cursor
    # then: every record after the cursor, untouched the whole time, is returned
    assert {f"t{i:02d}" for i in range(4, 10)} | {"u1", "u2"} <= set(seen), seen


@pytest.mark.parametrize("seed", range(5))
def test_records_moving_around_every_index_read_never_hide_an_untouched_one(
    stores: tuple[RedisStore, RedisStore], seed: int
) -> None:
    # given: 60 records in three tie groups, scanned three at a time
    scanner, writer = stores
    current = {f"r{i:02d}": _envelope(f"r{i:02d}", T0 + i // 20) for i in range(60)}
    for envelope in current.values():
        assert writer.create(envelope) is True
    chooser = random.Random(seed)
    touched: set[str] = set()
    zrange = scanner._client.zrange

    def zrange_then_write(*args: Any, **kwargs: Any) -> Any:
        rows = zrange(*args, **kwargs)
        # when: after every index read another client re-writes a random record, moving it
        # inside its tie group's range, ahead, or to a final state
        victim = current[chooser.choice(sorted(current))]
        moved = replace(
            victim,
            version=victim.version + 1,
            updated_at_ms=victim.updated_at_ms + chooser.choice([0, 0, 1, 5]),
            state=chooser.choice(["running", "running", "completed"]),
        )
        assert writer.compare_and_set(moved, victim.version) is True
        if moved.state == "running":
            current[victim.id] = moved
        else:
            del current[victim.id]
        touched.add(victim.id)
        return rows

    scanner._client.zrange = zrange_then_write  # type: ignore[method-assign]
    seen = _scan_ids(scanner, limit=3)
    # then: every record never written during the scan is returned exactly once
    untouched = {f"r{i:02d}" for i in range(60)} - touched
    assert untouched, "the test moved every record"
    assert {i for i in seen if i in untouched} == untouched
    assert all(seen.count(i) == 1 for i in untouched)
