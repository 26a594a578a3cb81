"""The retention pass reads what it deletes, never the final sagas still within retention
(docs/design.md §7): counted on PostgreSQL with ``EXPLAIN ANALYZE`` and on Redis by command."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import text

from celery_sagas._codec import Codec
from celery_sagas._engine import Engine
from celery_sagas._records import SagaRecord, SagaState
from celery_sagas._repository import SagaRepository
from celery_sagas._retention import retention_pass
from celery_sagas._scans import Scans
from celery_sagas._sweep import Sweeper, SweepReport
from celery_sagas.stores.base import Envelope, Store
from celery_sagas.stores.sql import SqlStore
from celery_sagas.testing.dispatcher import RecordingDispatcher
from tests.e2e.sweep_app import HOUR_MS, bulk_insert, registry
from tests.stores.test_scan_cost import Counted, Selects, _rows_examined, counted_pair, pg_pair

__all__ = ["counted_pair", "pg_pair"]  # fixtures used here

DUE = 100
KEPT = 20_000


def _finals(prefix: str, count: int, at_ms: int) -> list[Envelope]:
    codec, states = Codec(), (SagaState.COMPLETED, SagaState.COMPENSATED)
    return [codec.saga_envelope(SagaRecord(f"{prefix}-{n:05d}", "order", states[n % 2],
                                           {"n": n}, at_ms, at_ms + n % 1000))
            for n in range(count)]


def _retention_sweep(store: Store) -> SweepReport:
    codec = Codec()
    engine = Engine(SagaRepository(store, codec), registry(), RecordingDispatcher())
    sweeper = Sweeper(engine, Scans(store, codec), owner="retention-cost", lease_ms=60_000,
                      page_size=50, extra_passes=[retention_pass(HOUR_MS)])
    report = sweeper.sweep()
    assert report.complete and report.errors == 0
    return report


def _load(store: Store, with_kept: bool) -> None:
    now = int(time.time() * 1000)
    bulk_insert(store, _finals("due", DUE, now - 3 * HOUR_MS))
    if with_kept:
        bulk_insert(store, _finals("kept", KEPT, now - HOUR_MS // 2))


@pytest.mark.postgres
def test_a_postgres_retention_pass_examines_only_the_rows_it_deletes(
    pg_pair: tuple[SqlStore, SqlStore],
) -> None:
    # given: 100 final sagas past retention in both stores, and 20,000 within it in (b)
    a, b = pg_pair
    for store, kept in ((a, False), (b, True)):
        _load(store, kept)
        with store.engine.begin() as conn:
            conn.execute(text(f"ANALYZE {store.table_prefix}envelopes"))

    # when: each sweep's SELECTs are replayed under EXPLAIN ANALYZE (after its deletes: the
    # 20,000 kept rows are all (b) still holds)
    examined = {}
    for name, store in (("a", a), ("b", b)):
        selects = Selects(store.engine)
        try:
            report = _retention_sweep(store)
        finally:
            selects.close()
        assert report.deleted == DUE
        examined[name] = _rows_examined(store, selects.statements)

    # then: (b) reads no more rows than (a), and never walks its table sequentially
    (rows_a, _), (rows_b, kinds_b) = examined["a"], examined["b"]
    assert rows_b <= rows_a
    assert "Seq Scan" not in kinds_b
    with b.engine.begin() as conn:
        left = conn.execute(text(f"SELECT count(*) FROM {b.table_prefix}envelopes")).scalar_one()
    assert left == KEPT


@pytest.mark.redis
def test_a_redis_retention_pass_never_reads_a_saga_within_retention(
    counted_pair: tuple[Counted, Counted],
) -> None:
    # given
    a, b = counted_pair
    for counted, kept in ((a, False), (b, True)):
        _load(counted.store, kept)
        counted.store.delete("saga", "never-stored", 1)  # the delete script is loaded before
        counted.log.clear()

    # when
    for counted in (a, b):
        assert _retention_sweep(counted.store).deleted == DUE

    # then: the same commands, none of them about a kept saga
    def shape(counted: Counted) -> Counter[str]:
        return Counter(command[0].upper() for command in counted.log.commands)

    assert shape(b) == shape(a)
    assert [c for c in b.log.commands if any("kept-" in str(arg) for arg in c)] == []
