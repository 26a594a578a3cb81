"""SqlStore on SQLite, PostgreSQL and MariaDB: atomic primitives, fencing, paging, index use.

The shared contract is also checked by tests/stores/test_conformance.py; these tests pin what
is particular to SQL: single-statement CAS and grants under real thread races, the schema and
its scan index, the table prefix, and errors that must not leak through the driver.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Index,
    MetaData,
    Table,
    create_engine,
    event,
    insert,
    inspect,
    select,
    text,
    update,
)

from celery_sagas.errors import (
    FencedWriteRefused,
    InvalidRecordError,
    SagaValidationError,
    StoreError,
    StoreUnavailable,
)
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Envelope, Fence, Lease
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.stores.sql._dialects import ascii_key, long_text
from celery_sagas.stores.sql._schema import Tables, build_tables
from celery_sagas.testing.racing import race
from tests.stores.conftest import TablePool

T0 = 1_700_000_000_000
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, the test PostgreSQL or the test MariaDB."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sagas.db'}"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def store(db_url: str, unique_prefix: str, sql_tables: TablePool) -> Iterator[SqlStore]:
    """A store with an engine of its own on empty tables, emptied after the test for the next
    one (tests/stores/conftest.py)."""
    opened: SqlStore = sql_tables.borrow(
        db_url, unique_prefix + "_",
        lambda prefix, create: SqlStore.from_url(db_url, table_prefix=prefix,
                                                 create_schema=create))
    try:
        yield opened
    finally:
        sql_tables.give_back(db_url, opened)
        opened.close()


def tables_of(store: SqlStore) -> Tables:
    """The store's tables, for writing rows by hand."""
    return build_tables(store.table_prefix)


def envelope(
    record_id: str,
    *,
    version: int = 1,
    state: str = "running",
    at: int = T0,
    body: str = "{}",
    kind: str = "saga",
    label: str | None = None,
    due: int | None = None,
) -> Envelope:
    """An envelope with test defaults."""
    return Envelope(kind, record_id, version, state, at, body, label, due)




class StatementCounter:
    """Counts the statements an engine sends to the database."""

    def __init__(self, engine: Engine) -> None:
        self.statements: list[tuple[str, Any]] = []
        self._engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        self.statements.append((statement, parameters))

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


# ------------------------------------------------------------------ records


def test_duplicate_create_is_refused(store: SqlStore) -> None:
    first = envelope("order-1", body='{"n":1}')
    assert store.create(first) is True
    assert store.create(envelope("order-1", body='{"n":2}', state="completed")) is False
    assert store.get("saga", "order-1") == first


def test_ids_that_differ_only_in_case_are_different_records(store: SqlStore) -> None:
    assert store.create(envelope("Order-1", body='{"upper":true}')) is True
    assert store.create(envelope("order-1", body='{"upper":false}')) is True
    stored = store.get("saga", "Order-1")
    assert stored is not None and stored.body == '{"upper":true}'


def test_a_large_unicode_body_round_trips(store: SqlStore) -> None:
    body = '{"blob":"' + "caf\u00e9 \U0001f600 \u65e5\u672c " * 120_000 + '"}'
    assert len(body.encode()) > 2 * 1024 * 1024
    big = envelope("big", body=body)
    assert store.create(big) is True
    assert store.get("saga", "big") == big


def test_stale_cas_is_refused(store: SqlStore) -> None:
    store.create(envelope("s"))
    second = envelope("s", version=2, at=T0 + 1, body='{"n":2}')
    assert store.compare_and_set(second, 1) is True
    assert store.compare_and_set(envelope("s", version=2, at=T0 + 2, body='{"stale":1}'), 1) is False
    assert store.get("saga", "s") == second


def test_a_retried_cas_that_was_applied_reports_true(store: SqlStore) -> None:
    store.create(envelope("r"))
    second = envelope("r", version=2, state="compensating", at=T0 + 1)
    assert store.compare_and_set(second, 1) is True
    assert store.compare_and_set(second, 1) is True
    assert store.get("saga", "r") == second


def test_one_of_sixteen_racing_cas_writers_wins(store: SqlStore) -> None:
    store.create(envelope("raced"))
    writes = [envelope("raced", version=2, at=T0 + 1, body=f'{{"writer":{i}}}') for i in range(16)]
    results = race(lambda i: store.compare_and_set(writes[i], 1), 16)
    assert results.count(True) == 1 and results.count(False) == 15, results
    assert store.get("saga", "raced") == writes[results.index(True)]


def test_a_fenced_cas_is_refused_after_a_newer_grant(store: SqlStore) -> None:
    store.create(envelope("f"))
    old = store.acquire_lease("sweep", "alice", "tok-a", T0, 1000)
    assert old is not None
    new = store.acquire_lease("sweep", "bob", "tok-b", T0 + 1000, 1000)
    assert new is not None and new.fence > old.fence
    with pytest.raises(FencedWriteRefused) as refused:
        store.compare_and_set(envelope("f", version=2, body='{"by":"old"}'), 1, fence=Fence.of(old))
    assert (refused.value.lease, refused.value.fence) == ("sweep", old.fence)
    assert store.get("saga", "f") == envelope("f")
    by_new = envelope("f", version=2, body='{"by":"new"}')
    assert store.compare_and_set(by_new, 1, fence=Fence.of(new)) is True
    assert store.get("saga", "f") == by_new


def test_a_corrupt_row_raises_invalid_record_on_get(store: SqlStore) -> None:
    store.create(envelope("bad"))
    table = tables_of(store).envelopes
    for version in (0, -3):
        with store.engine.begin() as conn:
            conn.execute(update(table).where(table.c.id == "bad").values(version=version))
        with pytest.raises(InvalidRecordError) as raised:
            store.get("saga", "bad")
        assert (raised.value.kind, raised.value.record_id) == ("saga", "bad")


def test_a_scan_hands_a_corrupt_row_on_instead_of_stopping(store: SqlStore) -> None:
    for i in range(3):
        store.create(envelope(f"c{i}", at=T0 + i))
    table = tables_of(store).envelopes
    with store.engine.begin() as conn:
        conn.execute(update(table).where(table.c.id == "c1").values(version=0))
    page = store.scan("saga", ["running"], limit=10)
    assert [(item.id, item.version) for item in page.items] == [("c0", 1), ("c1", 0), ("c2", 1)]


# ------------------------------------------------------------------ notes, delete, buckets


def _raw_notes(store: SqlStore, record_id: str) -> Any:
    table = tables_of(store).envelopes
    with store.engine.begin() as conn:
        return conn.execute(select(table.c.notes).where(table.c.id == record_id)).scalar_one()


def test_notes_are_kept_newline_separated_and_cleared_by_a_cas(store: SqlStore) -> None:
    store.create(envelope("n"))
    store.annotate("saga", "n", '{"claim":1}')
    noted = store.annotate("saga", "n", "second note")
    assert noted is not None and noted.notes == ('{"claim":1}', "second note")
    assert _raw_notes(store, "n") == '{"claim":1}\nsecond note'
    assert store.compare_and_set(envelope("n", version=4, at=T0 + 3), 3) is True
    assert _raw_notes(store, "n") is None
    assert store.get("saga", "n") == envelope("n", version=4, at=T0 + 3)


def test_an_empty_notes_column_holds_no_notes(store: SqlStore) -> None:
    store.create(envelope("e"))
    table = tables_of(store).envelopes
    with store.engine.begin() as conn:
        conn.execute(update(table).where(table.c.id == "e").values(notes=""))
    assert store.get("saga", "e") == envelope("e")
    noted = store.annotate("saga", "e", "only")
    assert noted is not None and noted.notes == ("only",)


def test_get_cas_and_annotate_are_one_statement_each(store: SqlStore) -> None:
    store.create(envelope("one"))
    counter = StatementCounter(store.engine)
    try:
        store.get("saga", "one")
        assert store.compare_and_set(envelope("one", version=2, at=T0 + 1), 1) is True
        if store.engine.dialect.update_returning:
            assert store.annotate("saga", "one", "x") is not None
    finally:
        counter.close()
    verbs = [statement.split()[0].upper() for statement, _ in counter.statements]
    assert verbs[:2] == ["SELECT", "UPDATE"] and verbs[2:] in ([], ["UPDATE"]), verbs


def test_annotate_without_returning_reads_back_inside_the_updates_transaction(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MySQL/MariaDB have no UPDATE ... RETURNING; SQLite is sent down the same path to prove it
    if store.engine.dialect.name == "postgresql":
        pytest.skip("PostgreSQL annotates with one UPDATE ... RETURNING")
    monkeypatch.setattr(store.engine.dialect, "update_returning", False)
    store.create(envelope("rb"))
    annotator = threading.get_ident()
    interloper: list[Any] = []
    finished = threading.Event()

    def interfere() -> None:
        interloper.append(store.annotate("saga", "rb", "theirs"))
        finished.set()

    verbs: list[str] = []

    def after_execute(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() != annotator:
            return
        verbs.append(statement.split()[0].upper())
        if verbs[-1] == "UPDATE":
            threading.Thread(target=interfere, daemon=True).start()
            # the row stays locked until our COMMIT: the other writer must wait for it
            assert not finished.wait(0.5), "another writer got in between the UPDATE and the read"

    event.listen(store.engine, "after_cursor_execute", after_execute)
    try:
        ours = store.annotate("saga", "rb", "ours", expected_version=1)
    finally:
        event.remove(store.engine, "after_cursor_execute", after_execute)
    assert finished.wait(30)
    assert verbs == ["BEGIN", "UPDATE", "SELECT", "COMMIT"], verbs
    assert ours == Envelope("saga", "rb", 2, "running", T0, "{}", notes=("ours",))
    theirs = interloper[0]
    assert theirs is not None and (theirs.version, theirs.notes) == (3, ("ours", "theirs"))


def test_a_refused_fenced_delete_raises_and_keeps_the_record(store: SqlStore) -> None:
    store.create(envelope("d"))
    old = store.acquire_lease("sweep", "alice", "tok-a", T0, 1000)
    assert old is not None
    new = store.acquire_lease("sweep", "bob", "tok-b", T0 + 1000, 1000)
    assert new is not None
    with pytest.raises(FencedWriteRefused) as refused:
        store.delete("saga", "d", 1, fence=Fence.of(old))
    assert (refused.value.lease, refused.value.fence) == ("sweep", old.fence)
    assert store.get("saga", "d") == envelope("d")
    assert store.delete("saga", "d", 1, fence=Fence.of(new)) is True
    assert store.get("saga", "d") is None


def test_the_one_bucket_is_bucket_zero(store: SqlStore) -> None:
    assert store.buckets == 1 and store.bucket_of("any-id") == 0
    lease = store.acquire_lease("sweep", "alice", "tok-a", T0, 1000, bucket=0)
    assert lease is not None and lease.bucket == 0
    assert store.scan("saga", ["running"], bucket=0).items == ()
    assert store.scan_due("saga", due_before_ms=T0, bucket=0).items == ()
    store.create(envelope("b"))
    with pytest.raises(SagaValidationError):
        store.acquire_lease("other", "alice", "tok-a", T0, 1000, bucket=1)
    with pytest.raises(SagaValidationError):
        store.scan("saga", ["running"], bucket=1)
    with pytest.raises(SagaValidationError):
        store.scan_due("saga", due_before_ms=T0, bucket=1)
    with pytest.raises(SagaValidationError):
        store.compare_and_set(envelope("b", version=2), 1, fence=Fence("sweep", lease.fence, 1))
    with pytest.raises(SagaValidationError):
        store.renew_lease(Lease("sweep", "alice", "tok-a", T0 + 1000, lease.fence, None, 1), T0, 10)
    assert store.get("saga", "b") == envelope("b")


# ------------------------------------------------------------------ leases


def test_lease_acquire_steal_renew_and_release(store: SqlStore) -> None:
    lease = store.acquire_lease("sweep", "alice", "tok-a", T0, 1000)
    assert lease == Lease("sweep", "alice", "tok-a", T0 + 1000, 1, None)
    assert store.acquire_lease("sweep", "bob", "tok-b", T0 + 999, 1000) is None
    renewed = store.renew_lease(lease, T0 + 500, 1000)
    assert renewed == Lease("sweep", "alice", "tok-a", T0 + 1500, 1, None)
    assert store.renew_lease(Lease("sweep", "alice", "forged", T0, 1), T0 + 600, 1000) is None
    assert store.acquire_lease("sweep", "bob", "tok-b", T0 + 1200, 1000) is None
    assert store.release_lease(lease) is True
    assert store.release_lease(lease) is False
    taken = store.acquire_lease("sweep", "bob", "tok-b", T0 + 1201, 1000)
    assert taken is not None and taken.fence == 2


def test_lease_cursor_survives_expiry_and_release(store: SqlStore) -> None:
    alice = store.acquire_lease("sweep", "alice", "tok-a", T0, 1000)
    assert alice is not None
    assert store.checkpoint_lease(alice, "page-3", T0 + 10) is True
    assert store.checkpoint_lease(alice, "page-3", T0 + 11) is True  # same value: still a match
    assert store.checkpoint_lease(Lease("sweep", "alice", "forged", 0, 1), "x", T0 + 12) is False
    renewed = store.renew_lease(alice, T0 + 20, 1000)
    assert renewed is not None and renewed.cursor == "page-3"
    assert store.checkpoint_lease(alice, "too-late", T0 + 1020) is False
    bob = store.acquire_lease("sweep", "bob", "tok-b", T0 + 1020, 1000)
    assert bob is not None and (bob.fence, bob.cursor) == (2, "page-3")
    assert store.renew_lease(alice, T0 + 1021, 1000) is None
    assert store.release_lease(alice) is False
    assert store.checkpoint_lease(bob, "page-9", T0 + 1030) is True
    assert store.release_lease(bob) is True
    carol = store.acquire_lease("sweep", "carol", "tok-c", T0 + 1031, 1000)
    assert carol is not None and (carol.fence, carol.cursor) == (3, "page-9")


def test_fences_strictly_increase_while_eight_threads_race_each_grant(store: SqlStore) -> None:
    fences: list[int] = []
    for round_no in range(5):
        now = T0 + round_no * 10_000  # every earlier grant has expired
        results = race(
            lambda i, now=now: store.acquire_lease("race", f"o{i}", f"tok-{now}-{i}", now, 5_000), 8
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1 and results.count(None) == 7, results
        fences.append(winners[0].fence)
    assert fences == sorted(set(fences)) and fences[0] >= 1, fences


# ------------------------------------------------------------------ scans


def _seed(stores: list[Any], rng: random.Random) -> None:
    ids = [f"{rng.choice(['A', 'a', 'B', 'b'])}{rng.randrange(10_000):04d}" for _ in range(90)]
    for record_id in dict.fromkeys(ids):
        kind = rng.choice(["saga", "saga", "saga", "effect"])
        state = rng.choice(["running", "compensating", "completed"])
        at = T0 + rng.randrange(12)  # many ties on updated_at_ms
        label = rng.choice([None, "def-a", "def-b"])
        due = rng.choice([None, T0 + rng.randrange(8)])  # ties on due_at_ms too
        written = envelope(record_id, kind=kind, state=state, at=at, label=label, due=due)
        for target in stores:
            assert target.create(written) is True


def _pages(scan: Callable[[str | None], Any]) -> list[Any]:
    """Every page of a paged scan, following its cursors."""
    pages, cursor = [], None
    while True:
        page = scan(cursor)
        pages.append(page)
        if page.cursor is None:
            return pages
        cursor = page.cursor


@pytest.mark.parametrize("label", [None, "def-a"])
def test_scan_pages_match_the_reference_store_exactly(store: SqlStore, label: str | None) -> None:
    reference = MemoryStore()
    _seed([store, reference], random.Random(7))
    states = ["compensating", "running"]
    for limit in (1, 4, 1000):
        for before in (None, T0 + 6):
            def scan(target: Any, limit: int = limit, before: int | None = before) -> list[Any]:
                return _pages(lambda cursor: target.scan(
                    "saga", states, label=label, updated_before_ms=before, cursor=cursor, limit=limit
                ))

            pages = scan(store)
            assert pages == scan(reference)  # the same items and the same cursors
            items = [item for page in pages for item in page.items]
            assert len({item.id for item in items}) == len(items)
            assert all(item.state in states and label in (None, item.label) for item in items)


def test_due_pages_match_the_reference_store_exactly(store: SqlStore) -> None:
    reference = MemoryStore()
    _seed([store, reference], random.Random(11))
    for limit in (1, 3, 1000):
        for before in (T0, T0 + 4, T0 + 100):
            def scan(target: Any, limit: int = limit, before: int = before) -> list[Any]:
                return _pages(lambda cursor: target.scan_due(
                    "saga", due_before_ms=before, cursor=cursor, limit=limit
                ))

            pages = scan(store)
            assert pages == scan(reference)
            due = [(item.due_at_ms, item.id) for page in pages for item in page.items]
            assert due == sorted(due) and all(at < before for at, _ in due)


def test_counts_match_the_reference_store(store: SqlStore) -> None:
    reference = MemoryStore()
    _seed([store, reference], random.Random(13))
    for states in (["running"], ["running", "completed", "running"]):
        for label in (None, "def-b"):
            for after, before in ((None, None), (T0 + 3, None), (None, T0 + 9), (T0 + 2, T0 + 5)):
                args: dict[str, Any] = {
                    "label": label, "updated_after_ms": after, "updated_before_ms": before
                }
                assert store.count("saga", states, **args) == reference.count("saga", states, **args)


@pytest.mark.parametrize("limit", [0, 1001, -5, True, 2.0])
def test_scan_limits_outside_1_to_1000_raise(store: SqlStore, limit: Any) -> None:
    with pytest.raises(SagaValidationError):
        store.scan("saga", ["running"], limit=limit)
    with pytest.raises(SagaValidationError):
        store.scan_due("saga", due_before_ms=T0, limit=limit)


def _plan(store: SqlStore, statement: str, parameters: Any) -> list[str]:
    dialect = store.engine.dialect.name
    with store.engine.connect() as conn:
        if dialect == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
            return [str(row[-1]) for row in rows]
        if dialect == "postgresql":
            return [str(row[0]) for row in conn.exec_driver_sql("EXPLAIN " + statement, parameters)]
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
        return [f"table={row['table']} key={row['key']}" for row in rows]


def _row_of(table: Any, written: Envelope) -> dict[str, Any]:
    """The row the store writes for ``written`` (no notes)."""
    row = {column.name: getattr(written, column.name) for column in table.c
           if column.name not in ("notes", "created_at_ms")}
    return {**row, "notes": None, "created_at_ms": written.updated_at_ms}


def _fill_for_planner(store: SqlStore, bulk: list[Envelope], live: list[Envelope]) -> None:
    table = tables_of(store).envelopes
    rows = [_row_of(table, e) for e in bulk + live]
    # one transaction: the store's engine autocommits, which would commit row by row
    with store.engine.execution_options(isolation_level="SERIALIZABLE").begin() as conn:
        conn.execute(insert(table), rows)
    analyze = {"sqlite": "ANALYZE", "postgresql": f"ANALYZE {table.name}"}
    with store.engine.begin() as conn:
        conn.execute(text(analyze.get(store.engine.dialect.name, f"ANALYZE TABLE {table.name}")))


def _the_only_statement(store: SqlStore, call: Callable[[], object]) -> tuple[str, Any]:
    counter = StatementCounter(store.engine)
    try:
        call()
    finally:
        counter.close()
    [(statement, parameters)] = counter.statements
    return statement, parameters


def _assert_served_by(store: SqlStore, call: Callable[[], object], index: str, columns: str,
                      *, or_by: tuple[str, ...] = ()) -> None:
    """The one statement ``call`` sends reads the envelopes only through ``index`` (or one of
    ``or_by``; on SQLite: through its leading ``columns``), never by walking the table."""
    plan = _plan(store, *_the_only_statement(store, call))
    envelopes = tables_of(store).envelopes.name
    names = [f"ix_{store.table_prefix}envelopes_{name}" for name in (index, *or_by)]
    dialect = store.engine.dialect.name
    if dialect == "sqlite":
        assert any(f"INDEX {name} ({columns}" in line for line in plan for name in names), plan
        assert not any(line.startswith(f"SCAN {envelopes}") for line in plan), plan
    elif dialect == "postgresql":
        assert any(name in line for line in plan for name in names), plan
        assert not any(f"Seq Scan on {envelopes}" in line for line in plan), plan
    else:
        touched = [line for line in plan if line.startswith(f"table={envelopes} ")]
        assert touched and all(any(line.endswith(f"key={name}") for name in names)
                               for line in touched), plan


def _fill_with_finished_sagas(store: SqlStore) -> None:
    bulk = [envelope(f"done-{i:05d}", state="completed", at=T0 + i) for i in range(3000)]
    live = [envelope(f"live-{i:02d}", state=("running", "compensating")[i % 2], at=T0 + i) for i in range(30)]
    _fill_for_planner(store, bulk, live)


@pytest.mark.parametrize("states", [["running"], ["running", "compensating"]], ids=len)
def test_the_scan_query_uses_the_scan_index(store: SqlStore, states: list[str]) -> None:
    _fill_with_finished_sagas(store)
    first = store.scan("saga", states, limit=5)
    assert first.cursor is not None
    _assert_served_by(
        store,
        lambda: store.scan("saga", states, cursor=first.cursor, updated_before_ms=T0 + 25, limit=5),
        "scan", "kind=? AND state=?",
    )


@pytest.mark.parametrize("newest_first", [False, True])
def test_an_ordered_scan_by_created_uses_the_created_index(store: SqlStore,
                                                           newest_first: bool) -> None:
    _fill_with_finished_sagas(store)
    states = ["running", "compensating"]
    first = store.scan_ordered("saga", states, newest_first=newest_first, limit=5, by="created")
    assert first.cursor is not None and len(first.items) == 5
    _assert_served_by(
        store,
        lambda: store.scan_ordered("saga", states, newest_first=newest_first,
                                   cursor=first.cursor, limit=5, by="created"),
        "created", "kind=? AND state=?",
    )


def test_a_count_uses_the_scan_index(store: SqlStore) -> None:
    _fill_with_finished_sagas(store)
    assert store.count("saga", ["running", "compensating"], updated_after_ms=T0 + 2) == 28
    _assert_served_by(
        store,
        lambda: store.count("saga", ["running", "compensating"], updated_after_ms=T0 + 2),
        "scan", "kind=? AND state=?",
        or_by=("created",),  # 30 rows: a planner may read either (kind, state) range
    )


def _fill_with_one_busy_label(store: SqlStore) -> None:
    """3,000 open sagas of one definition, due far ahead; 30 of another, due now."""
    bulk = [envelope(f"bulk-{i:05d}", state=("running", "compensating")[i % 2], at=T0 + i, label="bulk",
                     due=T0 + 10**7 + i) for i in range(3000)]
    live = [envelope(f"mine-{i:02d}", state=("running", "compensating")[i % 2], at=T0 + i, label="mine",
                     due=T0 + i) for i in range(30)]
    _fill_for_planner(store, bulk, live)


@pytest.mark.parametrize("states", [["running"], ["running", "compensating"]], ids=len)
def test_a_label_scan_uses_the_label_index(store: SqlStore, states: list[str]) -> None:
    _fill_with_one_busy_label(store)
    first = store.scan("saga", states, label="mine", limit=5)
    assert first.cursor is not None and all(item.label == "mine" for item in first.items)
    _assert_served_by(
        store,
        lambda: store.scan("saga", states, label="mine", cursor=first.cursor, limit=5),
        "label", "kind=? AND label=? AND state=?",
    )


def test_a_label_count_uses_the_label_index(store: SqlStore) -> None:
    _fill_with_one_busy_label(store)
    assert store.count("saga", ["running"], label="mine", updated_before_ms=T0 + 10) == 5
    _assert_served_by(
        store,
        lambda: store.count("saga", ["running"], label="mine", updated_before_ms=T0 + 10),
        "label", "kind=? AND label=? AND state=?",
    )


def test_scan_due_uses_the_due_index(store: SqlStore) -> None:
    _fill_with_one_busy_label(store)
    first = store.scan_due("saga", due_before_ms=T0 + 20, limit=5)
    assert [item.id for item in first.items] == [f"mine-{i:02d}" for i in range(5)]
    assert first.cursor is not None
    _assert_served_by(
        store,
        lambda: store.scan_due("saga", due_before_ms=T0 + 20, cursor=first.cursor, limit=5),
        "due", "kind=? AND due_at_ms",
    )


def test_stores_racing_to_create_the_schema_all_open(db_url: str, unique_prefix: str) -> None:
    prefix = unique_prefix + "_"
    results = race(lambda _: SqlStore.from_url(db_url, table_prefix=prefix), 6)
    opened = [r for r in results if isinstance(r, SqlStore)]
    try:
        assert len(opened) == 6, results
        assert opened[0].create(envelope("after-race")) is True
    finally:
        if opened:
            opened[0].drop_schema()
        for each in opened:
            each.close()


# ------------------------------------------------------------------ schema upgrade


def _previous_version_tables(prefix: str) -> MetaData:
    """The tables exactly as the previous version of the store created them."""
    metadata = MetaData()
    mysql_options: dict[str, Any] = {
        "mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"
    }
    Table(
        f"{prefix}envelopes",
        metadata,
        Column("kind", ascii_key(32), primary_key=True),
        Column("id", ascii_key(255), primary_key=True),
        Column("version", BigInteger, nullable=False),
        Column("state", ascii_key(64), nullable=False),
        Column("updated_at_ms", BigInteger, nullable=False),
        Column("body", long_text(), nullable=False),
        Index(f"ix_{prefix}envelopes_scan", "kind", "state", "updated_at_ms", "id"),
        **mysql_options,
    )
    Table(
        f"{prefix}leases",
        metadata,
        Column("name", ascii_key(128), primary_key=True),
        Column("owner", ascii_key(255), nullable=True),
        Column("token_hash", ascii_key(64), nullable=True),
        Column("expires_at_ms", BigInteger, nullable=False),
        Column("fence", BigInteger, nullable=False),
        Column("scan_cursor", long_text(), nullable=True),
        **mysql_options,
    )
    return metadata


@pytest.fixture
def previous_version(db_url: str, unique_prefix: str) -> Iterator[tuple[str, str]]:
    """(url, prefix) of tables the previous version made, holding one saga and one lease."""
    prefix = unique_prefix + "_"
    owner = SqlStore.from_url(db_url, table_prefix=prefix, create_schema=False)
    metadata = _previous_version_tables(prefix)
    old_row = {"kind": "saga", "id": "old-1", "version": 3, "state": "running",
               "updated_at_ms": T0, "body": '{"old":true}'}
    lease = {"name": "sweep", "owner": None, "token_hash": None, "expires_at_ms": 0, "fence": 4,
             "scan_cursor": "page-2"}
    try:
        metadata.create_all(owner.engine)
        with owner.engine.begin() as conn:
            conn.execute(insert(metadata.tables[f"{prefix}envelopes"]), old_row)
            conn.execute(insert(metadata.tables[f"{prefix}leases"]), lease)
        yield db_url, prefix
    finally:
        owner.drop_schema()
        owner.close()


def _shape(store: SqlStore) -> tuple[set[str], set[str]]:
    table = tables_of(store).envelopes.name
    with store.engine.connect() as conn:
        found = inspect(conn)
        columns = {column["name"] for column in found.get_columns(table)}
        indexes = {str(index["name"]) for index in found.get_indexes(table)}
    return columns, indexes


def test_create_schema_upgrades_a_table_of_the_previous_version(previous_version: tuple[str, str]) -> None:
    url, prefix = previous_version
    store = SqlStore.from_url(url, table_prefix=prefix)
    try:
        columns, indexes = _shape(store)
        assert {"label", "due_at_ms", "notes"} <= columns
        assert {f"ix_{prefix}envelopes_{name}"
                for name in ("scan", "label", "due", "created")} <= indexes
        assert "created_at_ms" in columns
        old = Envelope("saga", "old-1", 3, "running", T0, '{"old":true}')
        assert store.get("saga", "old-1") == old
        noted = store.annotate("saga", "old-1", "claim", expected_version=3)
        assert noted is not None and (noted.version, noted.notes) == (4, ("claim",))
        moved = Envelope("saga", "old-1", 5, "running", T0 + 2, "{}", due_at_ms=T0 + 9)
        assert store.compare_and_set(moved, 4) is True
        assert store.scan_due("saga", due_before_ms=T0 + 10).items == (moved,)
        assert store.count("saga", ["running"]) == 1
        assert store.create(envelope("new-1", label="def", due=T0)) is True
        assert [e.id for e in store.scan("saga", ["running"], label="def").items] == ["new-1"]
        lease = store.acquire_lease("sweep", "alice", "tok", T0, 1000)
        assert lease is not None and (lease.fence, lease.cursor) == (5, "page-2")
    finally:
        store.close()
    again = SqlStore.from_url(url, table_prefix=prefix)  # an upgraded table is left as it is
    try:
        assert _shape(again) == (columns, indexes)
    finally:
        again.close()


def test_rows_from_before_the_created_column_sort_at_their_last_write_until_reindexed(
        previous_version: tuple[str, str]) -> None:
    url, prefix = previous_version  # old-1: running, last written at T0, no creation time
    store = SqlStore.from_url(url, table_prefix=prefix)
    try:
        assert store.create(envelope("new-1", at=T0 - 5)) is True
        assert store.create(envelope("new-2", at=T0 + 5)) is True
        def created() -> list[str]:
            page = store.scan_ordered("saga", ["running"], limit=1000, by="created")
            return [e.id for e in page.items]
        assert created() == ["new-1", "old-1", "new-2"]
        paged = store.scan_ordered("saga", ["running"], limit=1, newest_first=True, by="created")
        paged = store.scan_ordered("saga", ["running"], limit=1, newest_first=True,
                                   cursor=paged.cursor, by="created")
        assert [e.id for e in paged.items] == ["old-1"]
        assert store.index_ids("saga", ["running"]) == 1
        assert store.index_ids("saga", ["running"]) == 0  # idempotent
        moved = Envelope("saga", "old-1", 4, "running", T0 + 9, "{}")
        assert store.compare_and_set(moved, 3) is True
        assert created() == ["new-1", "old-1", "new-2"]  # filled with T0, kept after the write
    finally:
        store.close()


def test_stores_racing_to_upgrade_the_previous_schema_all_open(previous_version: tuple[str, str]) -> None:
    url, prefix = previous_version
    results = race(lambda _: SqlStore.from_url(url, table_prefix=prefix), 6)
    opened = [r for r in results if isinstance(r, SqlStore)]
    try:
        assert len(opened) == 6, results
        columns, indexes = _shape(opened[0])
        assert {"label", "due_at_ms", "notes"} <= columns and len(indexes) >= 3
        assert opened[1].annotate("saga", "old-1", "after the race") is not None
    finally:
        for each in opened:
            each.close()


# ------------------------------------------------------------------ validation before SQL


@pytest.mark.parametrize("prefix", ["x; DROP TABLE y", "a-b", "p" * 40, "", "1abc", "t\u00e9"])
def test_a_table_prefix_that_is_not_an_identifier_is_refused(prefix: str, tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'prefix.db'}")
    counter = StatementCounter(engine)
    try:
        with pytest.raises(SagaValidationError):
            SqlStore(engine, table_prefix=prefix)
        with pytest.raises(SagaValidationError):
            SqlStore.from_url(f"sqlite:///{tmp_path / 'other.db'}", table_prefix=prefix)
        assert counter.statements == []
        assert not (tmp_path / "other.db").exists()
    finally:
        counter.close()
        engine.dispose()


BAD_IDS = ["", "has space", "x" * 256, "quote'; DROP TABLE t; --", "nul\x00", "caf\u00e9"]


@pytest.mark.parametrize("bad_id", BAD_IDS, ids=lambda v: repr(v[:10]))
def test_bad_ids_are_refused_before_any_sql(store: SqlStore, bad_id: str) -> None:
    counter = StatementCounter(store.engine)
    try:
        with pytest.raises(SagaValidationError):
            store.create(envelope(bad_id))
        with pytest.raises(SagaValidationError):
            store.get("saga", bad_id)
        with pytest.raises(SagaValidationError):
            store.compare_and_set(envelope(bad_id, version=2), 1)
        with pytest.raises(SagaValidationError):
            store.scan("saga", [bad_id])
        with pytest.raises(SagaValidationError):
            store.acquire_lease(bad_id, "owner", "tok", T0, 1000)
        with pytest.raises(SagaValidationError):
            store.release_lease(Lease(bad_id, "owner", "tok", T0, 1))
        with pytest.raises(SagaValidationError):
            store.compare_and_set(envelope("ok", version=2), 1, fence=Fence(bad_id, 1))
        with pytest.raises(SagaValidationError):
            store.annotate("saga", bad_id, "note")
        with pytest.raises(SagaValidationError):
            store.delete("saga", bad_id, 1)
        with pytest.raises(SagaValidationError):
            store.delete("saga", "ok", 1, fence=Fence(bad_id, 1))
        with pytest.raises(SagaValidationError):
            store.count("saga", [bad_id])
        with pytest.raises(SagaValidationError):
            store.scan("saga", ["running"], label=bad_id)
        with pytest.raises(SagaValidationError):
            store.create(envelope("ok", label=bad_id))
        assert counter.statements == []
    finally:
        counter.close()


@pytest.mark.parametrize("note", ["", "two\nlines", "x" * (2 * 1024 * 1024 + 1), "lone \ud800"], ids=len)
def test_bad_notes_and_arguments_are_refused_before_any_sql(store: SqlStore, note: str) -> None:
    counter = StatementCounter(store.engine)
    try:
        with pytest.raises(SagaValidationError):
            store.annotate("saga", "ok", note)
        with pytest.raises(SagaValidationError):
            store.annotate("saga", "ok", "fine", expected_version="1")  # type: ignore[arg-type]
        with pytest.raises(SagaValidationError):
            store.delete("saga", "ok", 1.0)  # type: ignore[arg-type]
        with pytest.raises(SagaValidationError):
            store.scan_due("saga", due_before_ms=-1)
        with pytest.raises(SagaValidationError):
            store.count("saga", ["running"], updated_after_ms=2**53)
        assert counter.statements == []
    finally:
        counter.close()


# ------------------------------------------------------------------ engines and errors


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://sagas:hunter2-secret@127.0.0.1:1/test",
        "mysql+pymysql://sagas:hunter2-secret@127.0.0.1:1/test",
    ],
    ids=["postgres", "mysql"],
)
def test_driver_errors_become_store_errors_without_the_password(url: str) -> None:
    with pytest.raises(StoreError) as raised:
        SqlStore.from_url(url)
    assert "hunter2-secret" not in str(raised.value) and "hunter2-secret" not in repr(raised.value)
    assert raised.value.__cause__ is not None
    store = SqlStore.from_url(url, create_schema=False)
    try:
        assert "hunter2-secret" not in repr(store)
        with pytest.raises(StoreError) as again:
            store.get("saga", "x")
        assert "hunter2-secret" not in str(again.value)
    finally:
        store.close()


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(StoreUnavailable):
        SqlStore.from_url("oracle+nodriver://u:p@127.0.0.1/x")


def test_durability_follows_where_sqlite_keeps_its_data(tmp_path: Path) -> None:
    memory = SqlStore.from_url("sqlite://")
    on_disk = SqlStore.from_url(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        assert memory.durable is False and on_disk.durable is True
    finally:
        memory.close()
        on_disk.close()


def test_sqlite_files_run_in_wal_mode_with_a_busy_timeout(tmp_path: Path) -> None:
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    finally:
        store.close()


def test_in_memory_sqlite_is_one_database_shared_by_threads() -> None:
    store = SqlStore.from_url("sqlite://")
    try:
        results = race(lambda i: store.create(envelope(f"m{i}", at=T0 + i)), 8)
        assert results == [True] * 8
        assert len(store.scan("saga", ["running"], limit=100).items) == 8
    finally:
        store.close()


def test_open_store_builds_a_sql_store_and_close_leaves_a_callers_engine(tmp_path: Path) -> None:
    opened = open_store(f"sqlite:///{tmp_path / 'o.db'}", table_prefix="shop_")
    assert isinstance(opened, SqlStore) and opened.table_prefix == "shop_"
    opened.close()
    engine = create_engine(f"sqlite:///{tmp_path / 'o.db'}")
    mine = SqlStore(engine, table_prefix="shop_")
    assert mine.create(envelope("e")) is True
    mine.close()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM shop_envelopes").scalar() == 1
    engine.dispose()


# ------------------------------------------------------------------ corrupt rows (issue 16)


def test_a_version_over_2_53_fails_get_and_is_handed_on_by_a_scan(store: SqlStore) -> None:
    store.create(envelope("big"))
    store.create(envelope("ok", at=T0 + 1))
    table = tables_of(store).envelopes
    with store.engine.begin() as conn:
        conn.execute(update(table).where(table.c.id == "big").values(version=2**63 - 1))
    with pytest.raises(InvalidRecordError):
        store.get("saga", "big")
    page = store.scan("saga", ["running"], limit=10)
    # the envelope check caps the version at 2**53-1 as on Redis: a placeholder without a body
    assert [(item.id, item.version, item.body) for item in page.items] == [
        ("big", 2**63 - 1, ""), ("ok", 1, "{}")]


def test_stored_states_lists_each_state_once_from_the_index(store: SqlStore) -> None:
    for i, state in enumerate(["running", "completed", "running", "weird", "completed"]):
        store.create(envelope(f"s{i}", state=state))
    store.create(envelope("a1", kind="approval", state="pending"))
    counter = StatementCounter(store.engine)
    try:
        assert store.stored_states("saga") == ["completed", "running", "weird"]
    finally:
        counter.close()
    assert len(counter.statements) == 1  # one statement: a loose index scan
    assert store.stored_states("approval") == ["pending"]
    assert store.stored_states("nothing") == []


def test_a_saga_row_of_an_unknown_state_or_version_is_reported_by_the_sweep(
    store: SqlStore,
) -> None:
    from celery import Celery

    from celery_sagas import Sagas
    from celery_sagas.testing import FrozenClock

    # given: two sagas recorded, then one row set to an unknown state and one to a huge version
    clock = FrozenClock()
    app = Celery("corrupt-rows", set_as_current=False, broker="memory://")
    sagas = Sagas(app, store=store, clock=clock)

    @sagas.step(compensate=None)
    def noop() -> None:
        """A step with nothing to undo."""

    @sagas.saga("corrupt-rows")
    def run(ctx: Any, _: Any) -> None:
        ctx.step(noop)

    run.start({}, saga_id="state-row")
    run.start({}, saga_id="version-row")
    table = tables_of(store).envelopes
    with store.engine.begin() as conn:
        conn.execute(update(table).where(table.c.id == "state-row").values(state="paused"))
        conn.execute(update(table).where(table.c.id == "version-row").values(version=2**63 - 1))
    clock.advance(10 * 60_000)

    # when
    report = sagas.sweep()

    # then
    assert report.errors == 0
    assert sorted((c.id, c.reason) for c in report.corrupt) == [
        ("state-row", "unknown state 'paused'"),
        ("version-row", "version 9223372036854775807 is outside 1..2**53-1"),
    ]
