"""A whole reconciliation pass costs the same with 20,000 final sagas kept as with none.

Counted, never timed: on Redis, every command the sweep sends (none may touch a final record
or its index); on PostgreSQL, the rows every SELECT of the sweep examines, read back with
``EXPLAIN (ANALYZE, FORMAT JSON)``. ``bench/scan_cost.py`` measures the same pass in seconds
with 1,000,000 final sagas.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine as SqlEngine

from celery_sagas._codec import Codec
from celery_sagas._definitions import Timing
from celery_sagas._engine import Engine, EngineSettings
from celery_sagas._repository import SagaRepository
from celery_sagas._scans import Scans
from celery_sagas._sweep import Sweeper, SweepReport
from celery_sagas.stores.base import Envelope, Store
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.testing.dispatcher import RecordingDispatcher
from tests.e2e.sweep_app import HOUR_MS, bulk_insert, registry, waiting_saga
from tests.stores.test_redis_store import CommandLog, counting_client

STALE = 120
FINAL = 20_000
PAGE = 50


def _stale(now_ms: int) -> list[Envelope]:
    codec = Codec()
    return [codec.saga_envelope(waiting_saga(f"stale-{n:04d}", n, now_ms - HOUR_MS + n))
            for n in range(STALE)]


def _final(now_ms: int) -> list[Envelope]:
    """Completed and compensated sagas, all updated long before any staleness cut-off."""
    states = ("completed", "compensated")
    return [Envelope("saga", f"final-{n:05d}", 5, states[n % 2], now_ms - 2 * HOUR_MS + n % 1000, "{}")
            for n in range(FINAL)]


def _sweep(store: Store) -> SweepReport:
    """One sweep of every bucket, counting the open states for the metrics gauge as well."""
    codec = Codec()
    engine = Engine(SagaRepository(store, codec), registry(), RecordingDispatcher(),
                    settings=EngineSettings(timing=Timing(stale_ms=60_000)))
    sweeper = Sweeper(engine, Scans(store, codec), owner="cost", lease_ms=60_000, page_size=PAGE,
                      count_states=True)
    report = sweeper.sweep()
    assert report.complete and report.examined == STALE and report.acted == 0
    assert report.buckets == store.buckets
    assert report.states == {"running": STALE, "compensating": 0, "manual-review": 0}
    return report


# ---------------------------------------------------------------------- Redis


@dataclass
class Counted:
    """A Redis store whose commands are logged, and a plain one for cleanup."""

    store: RedisStore
    log: CommandLog


@pytest.fixture
def counted_pair(redis_url: str, unique_prefix: str) -> Iterator[tuple[Counted, Counted]]:
    """(a) and (b) Redis stores under fresh prefixes, removed afterwards."""
    pair = []
    for suffix in ("a", "b"):
        log = CommandLog()
        store = RedisStore(counting_client(redis_url, log), prefix=unique_prefix + suffix,
                           require_aof=False)
        pair.append(Counted(store, log))
    try:
        yield pair[0], pair[1]
    finally:
        for counted in pair:
            client = counted.store._client
            keys = list(client.scan_iter(match=counted.store.layout.pattern(), count=5000))
            for start in range(0, len(keys), 5000):
                client.delete(*keys[start:start + 5000])
            client.close()


@pytest.mark.redis
def test_a_redis_sweep_sends_the_same_commands_with_twenty_thousand_final_sagas_kept(
    counted_pair: tuple[Counted, Counted],
) -> None:
    # given: the same stale sagas in both stores, and 20,000 final ones in (b)
    a, b = counted_pair
    now = int(time.time() * 1000)
    for counted in (a, b):
        bulk_insert(counted.store, _stale(now))
    bulk_insert(b.store, _final(now))
    a.log.clear()
    b.log.clear()

    # when
    _sweep(a.store)
    _sweep(b.store)

    # then: command for command the same work, and nothing final was ever touched
    def shape(log: CommandLog) -> Counter[str]:
        return Counter(command[0].upper() for command in log.commands)

    assert shape(b.log) == shape(a.log)
    assert shape(b.log)["HGETALL"] == STALE  # the running pass only: the gauge counts indexes
    final_keys = (":s:completed", ":s:compensated")
    touched = [c for c in b.log.commands if any("final-" in arg or arg.endswith(final_keys) for arg in c)]
    assert touched == []


# ---------------------------------------------------------------------- PostgreSQL


class Selects:
    """Records every SELECT an engine runs (statement and parameters, as sent to the driver)."""

    def __init__(self, engine: SqlEngine) -> None:
        self.engine = engine
        self.statements: list[tuple[str, Any]] = []
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
              executemany: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            self.statements.append((statement, parameters))

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def _examined(node: dict[str, Any]) -> tuple[int, list[str]]:
    """Rows a plan's table and index scans read (returned or filtered away), and scan types."""
    rows, kinds = 0, [node["Node Type"]]
    if "Scan" in node["Node Type"] and "Subquery" not in node["Node Type"]:
        rows += node["Actual Rows"] * node["Actual Loops"]
        rows += node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    for child in node.get("Plans", []):
        more, child_kinds = _examined(child)
        rows += more
        kinds += child_kinds
    return rows, kinds


def _rows_examined(store: SqlStore, selects: list[tuple[str, Any]]) -> tuple[int, list[str]]:
    """Rows examined by every statement, replayed under EXPLAIN ANALYZE, and the plan node types."""
    total, kinds = 0, []
    with store.engine.connect() as conn:
        for statement, parameters in selects:
            raw = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).scalar()
            plan = (raw if isinstance(raw, list) else json.loads(str(raw)))[0]["Plan"]
            rows, node_kinds = _examined(plan)
            total += rows
            kinds += node_kinds
    return total, kinds


@pytest.fixture
def pg_pair(postgres_url: str, unique_prefix: str) -> Iterator[tuple[SqlStore, SqlStore]]:
    """(a) and (b) PostgreSQL stores under fresh table prefixes, dropped afterwards."""
    a = SqlStore.from_url(postgres_url, table_prefix=unique_prefix + "a_")
    b = SqlStore.from_url(postgres_url, table_prefix=unique_prefix + "b_")
    try:
        yield a, b
    finally:
        for store in (a, b):
            store.drop_schema()
            store.close()


@pytest.mark.postgres
def test_a_postgres_sweep_examines_the_same_rows_with_twenty_thousand_final_sagas_kept(
    pg_pair: tuple[SqlStore, SqlStore],
) -> None:
    # given: the same stale sagas in both stores, and 20,000 final ones in (b); fresh statistics
    a, b = pg_pair
    now = int(time.time() * 1000)
    for store in (a, b):
        bulk_insert(store, _stale(now))
    bulk_insert(b, _final(now))
    for store in (a, b):
        with store.engine.begin() as conn:
            conn.execute(text(f"ANALYZE {store.table_prefix}envelopes"))

    # when: each sweep's SELECTs are replayed under EXPLAIN ANALYZE
    examined, statements = {}, {}
    for name, store in (("a", a), ("b", b)):
        selects = Selects(store.engine)
        try:
            _sweep(store)
        finally:
            selects.close()
        statements[name] = len(selects.statements)
        examined[name] = _rows_examined(store, selects.statements)

    # then: (b) reads no more rows than (a) (which may scan its tiny table whole), only the
    # stale ones (twice: the running pass and the gauge's count of the running index; each
    # query may peek one row past its page), and never walks its table sequentially
    (rows_a, _), (rows_b, kinds_b) = examined["a"], examined["b"]
    assert statements["b"] == statements["a"]
    assert rows_b <= rows_a
    assert rows_b <= 2 * STALE + statements["b"]
    assert "Seq Scan" not in kinds_b
