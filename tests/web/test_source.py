"""The adapter: exact counts from the store, pages through the store's scans, exact cursors."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import pytest

from celery_sagas import SagaRecord, SagaState, Store
from celery_sagas._codec import Codec
from celery_sagas.errors import SagaValidationError
from celery_sagas.web._events import announcer
from celery_sagas.web._source import PREFIX_READ, SagaFilter, SagaSource
from tests.web.conftest import Web

CODEC = Codec()


def seed(store: Store, count: int, *, state: SagaState = SagaState.COMPLETED,
         definition: str = "place-order", prefix: str = "s", at: int = 1_000) -> None:
    """``count`` bare saga records written straight to the store."""
    for n in range(count):
        record = SagaRecord(f"{prefix}-{n:04d}", definition, state, {"n": n}, at + n, at + n)
        assert store.create(CODEC.saga_envelope(record))


def source_of(web: Web) -> SagaSource:
    return SagaSource(web.sagas, announcer(()))


def walk(source: SagaSource, chosen: SagaFilter, limit: int) -> tuple[list[str], int]:
    """Every id the pages give, in order, and how many pages it took."""
    ids: list[str] = []
    cursor, pages = None, 0
    while True:
        page = source.page(chosen, cursor, limit=limit)
        ids += [r.saga_id for r in page.records]
        pages += 1
        assert page.read <= PREFIX_READ
        cursor = page.cursor
        if cursor is None:
            return ids, pages


@pytest.mark.parametrize("limit", [1, 3, 7, 50])
def test_pages_walk_every_record_exactly_once(web: Web, limit: int) -> None:
    # given
    seed(web.sagas.store, 23)

    # when
    ids, _ = walk(source_of(web), SagaFilter.of(["completed"], None, None), limit)

    # then
    assert ids == [f"s-{n:04d}" for n in range(23)]


def test_the_store_filters_by_definition_and_counts_the_matches(web: Web) -> None:
    # given: 5 of 50
    store = web.sagas.store
    seed(store, 45, definition="place-order")
    seed(store, 5, definition="notify-user", prefix="n")

    # when
    page = source_of(web).page(SagaFilter.of(["completed"], "notify-user", None), limit=50)

    # then: only the five were read
    assert [r.saga_id for r in page.records] == [f"n-{n:04d}" for n in range(5)]
    assert (page.read, page.cursor, page.matching) == (5, None, 5)


def test_a_page_reads_only_what_it_shows(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a store that records every scan's limit
    seed(web.sagas.store, 300)
    limits: list[int] = []
    real = web.sagas.store.scan

    def scan(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        return real(*args, **kwargs)

    monkeypatch.setattr(web.sagas.store, "scan", scan)

    # when
    page = source_of(web).page(SagaFilter(), limit=20)

    # then: one scan of one page, never a full load
    assert len(page.records) == 20 and limits == [20]


def test_an_id_prefix_filters_the_scanned_pages(web: Web) -> None:
    # given
    seed(web.sagas.store, 12)
    seed(web.sagas.store, 3, prefix="x")
    source = source_of(web)

    # when
    page = source.page(SagaFilter.of([], None, "x-"), None, limit=2)
    rest = source.page(SagaFilter.of([], None, "x-"), page.cursor, limit=2)

    # then
    assert [r.saga_id for r in page.records] == ["x-0000", "x-0001"]
    assert [r.saga_id for r in rest.records] == ["x-0002"] and rest.cursor is None
    assert page.exact is None and page.matching is None


def test_an_id_prefix_stops_at_the_read_limit_and_goes_on_from_there(
        web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a store without a prefix scan (as Redis); 3 matches among 50, 12 read per request
    monkeypatch.setattr("celery_sagas.web._source.PrefixScan", _NoPrefixScan)
    monkeypatch.setattr("celery_sagas.web._source.PREFIX_READ", 12)
    seed(web.sagas.store, 47, at=1_000)
    seed(web.sagas.store, 3, prefix="x", at=5_000)
    source = source_of(web)
    chosen = SagaFilter.of(["completed"], None, "x-")

    # when
    first = source.page(chosen, None, limit=10)
    ids, pages = walk(source, chosen, 10)

    # then
    assert first.read_spent and first.cursor is not None and first.read == 12
    assert ids == ["x-0000", "x-0001", "x-0002"]
    assert pages == 5  # 50 records, 12 read per request


@runtime_checkable
class _NoPrefixScan(Protocol):
    """A capability no store has: the web UI falls back to filtering a scan."""

    def scan_prefix_of_no_store(self) -> None: ...


def test_an_id_prefix_on_a_store_with_a_prefix_scan_reads_only_the_matches(web: Web) -> None:
    # given: 3 matches among 2,000 records
    seed(web.sagas.store, 2_000, at=1_000)
    seed(web.sagas.store, 3, prefix="x", at=5_000)
    source = source_of(web)
    chosen = SagaFilter.of(["completed"], None, "x-")

    # when
    page = source.page(chosen, None, limit=2)
    rest = source.page(chosen, page.cursor, limit=2)

    # then: by id, from the store's index, no read budget spent
    assert [r.saga_id for r in page.records] == ["x-0000", "x-0001"] and page.read == 2
    assert [r.saga_id for r in rest.records] == ["x-0002"] and rest.cursor is None
    assert not page.read_spent


def test_an_exact_id_is_found_at_once(web: Web) -> None:
    # given
    seed(web.sagas.store, 3)

    # then
    assert source_of(web).page(SagaFilter.of([], None, "s-0001"), limit=5).exact is not None


def test_records_that_fail_validation_are_listed_apart(web: Web) -> None:
    # given
    store = web.sagas.store
    seed(store, 2)
    bad = CODEC.saga_envelope(SagaRecord("bad-1", "place-order", SagaState.COMPLETED, {}, 5, 5))
    store.create(replace(bad, body='{"steps": 3}'))

    # when
    page = source_of(web).page(SagaFilter(), None, limit=10)

    # then
    assert [r.saga_id for r in page.records] == ["s-0000", "s-0001"]
    assert [c.id for c in page.corrupt] == ["bad-1"]


def test_the_overview_counts_exactly_by_state_and_definition(web: Web) -> None:
    # given
    store = web.sagas.store
    seed(store, 3, state=SagaState.MANUAL_REVIEW, prefix="m")
    seed(store, 20, state=SagaState.COMPLETED)
    seed(store, 4, state=SagaState.COMPENSATED, prefix="c", definition="notify-user")
    seed(store, 2, state=SagaState.RUNNING, prefix="u", definition="retired-flow")

    # when
    overview = source_of(web).overview()

    # then
    assert overview.by_state == {"running": 2, "compensating": 0, "completed": 20,
                                 "compensated": 4, "manual-review": 3}
    rows = {row.name: row.counts for row in overview.definitions}
    assert rows["place-order"]["completed"] == 20 and rows["place-order"]["manual-review"] == 3
    assert rows["notify-user"]["compensated"] == 4
    assert rows[None] == {"running": 2, "compensating": 0, "completed": 0, "compensated": 0,
                          "manual-review": 0}  # a definition this process does not know
    assert overview.total == 29


@runtime_checkable
class _NoSnapshot(Protocol):
    """A capability no store has: the overview counts one by one."""

    def no_such_capability(self) -> None: ...


def test_the_overview_counts_states_and_definitions_from_one_snapshot(
        web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    store = web.sagas.store
    seed(store, 3, state=SagaState.MANUAL_REVIEW, prefix="m")
    seed(store, 4, state=SagaState.COMPLETED, prefix="n", definition="notify-user")
    calls: list[str] = []
    for name in ("count", "count_snapshot"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name, lambda *a, _real=real, _name=name, **k: (
            calls.append(_name), _real(*a, **k))[1])

    # when
    overview = source_of(web).overview()

    # then: one snapshot for states and definitions; count only for time windows and stale
    assert calls.count("count_snapshot") == 1
    assert overview.by_state["completed"] == 4 and overview.by_state["manual-review"] == 3
    rows = {row.name: row.counts for row in overview.definitions}
    assert rows["notify-user"]["completed"] == 4 and rows["place-order"]["manual-review"] == 3


def test_overview_numbers_agree_and_are_never_negative_while_sagas_move(
        web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a store without CountSnapshot, where 5 sagas complete between the count per
    # state and the counts per definition
    monkeypatch.setattr("celery_sagas.web._source.CountSnapshot", _NoSnapshot)
    store = web.sagas.store
    seed(store, 3, state=SagaState.MANUAL_REVIEW, prefix="m")
    seed(store, 20, state=SagaState.COMPLETED)
    real = store.count

    def moving(kind: str, states: Any, *, label: str | None = None, **window: Any) -> int:
        found = real(kind, states, label=label, **window)
        return found + 5 if label == "place-order" and list(states) == ["completed"] else found

    monkeypatch.setattr(store, "count", moving)

    # when
    overview = source_of(web).overview()
    page = web.get("/").get_data(as_text=True)

    # then: each state's card is the sum of its definitions' rows, nothing below zero
    for state, total in overview.by_state.items():
        assert total == sum(row.counts[state] for row in overview.definitions) >= 0
    assert all(n >= 0 for row in overview.definitions for n in row.counts.values())
    assert overview.by_state["completed"] == 25 and overview.total == 28
    assert overview.attention.manual_review == overview.by_state["manual-review"] == 3
    assert f"{overview.total:,} sagas kept" in page and not re.search(r">\s*-\d", page)


def test_the_overview_counts_sagas_needing_an_operator(web: Web) -> None:
    # given: manual review, one running saga long idle, one just updated
    now = web.sagas.engine.now()
    store = web.sagas.store
    seed(store, 2, state=SagaState.MANUAL_REVIEW, prefix="m")
    seed(store, 1, state=SagaState.RUNNING, prefix="old", at=now - 3_600_000)
    seed(store, 1, state=SagaState.COMPENSATING, prefix="new", at=now)

    # when
    attention = source_of(web).overview().attention

    # then
    assert (attention.manual_review, attention.stale, attention.total) == (2, 1, 3)
    assert len(web.sagas.findings("sagas").findings) == attention.total


def test_finishes_are_counted_per_minute_over_the_last_hour(web: Web) -> None:
    # given
    now = web.sagas.engine.now()
    store = web.sagas.store
    for n, (state, minutes_ago) in enumerate([(SagaState.COMPLETED, 0), (SagaState.COMPLETED, 0),
                                              (SagaState.COMPENSATED, 5), (SagaState.COMPLETED, 59),
                                              (SagaState.COMPLETED, 61)]):
        at = now - minutes_ago * 60_000
        store.create(CODEC.saga_envelope(SagaRecord(f"f-{n}", "place-order", state, {}, at, at)))

    # when
    finishes = source_of(web).overview().finishes

    # then
    assert (finishes.completed[-1], finishes.completed[0], sum(finishes.completed)) == (2, 1, 3)
    assert finishes.compensated[-6] == 1 and sum(finishes.compensated) == 1


def test_the_overview_costs_counts_not_records(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a store that refuses to read records and counts its counts
    seed(web.sagas.store, 500)
    store = web.sagas.store
    counted: list[str] = []
    real = store.count

    def count(*args: Any, **kwargs: Any) -> int:
        counted.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "count", count)
    for name in ("scan", "get", "scan_due"):
        monkeypatch.setattr(store, name, _refusing(name))

    # when
    overview = source_of(web).overview()

    # then: no record read; counts per state, per definition and state, per minute with finishes
    assert overview.by_state["completed"] == 500
    definitions = len(web.sagas.registry.definitions)
    assert len(counted) <= 5 * (1 + definitions) + 2 + 2 + 60


def _refusing(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the overview called {name}")

    return refuse


@pytest.mark.parametrize("cursor", ["garbage", "W10", "WzIsbnVsbCwwLDAsIngiXQ"])
def test_a_malformed_cursor_is_refused(web: Web, cursor: str) -> None:
    # then
    with pytest.raises(SagaValidationError, match="cursor"):
        source_of(web).page(SagaFilter(), cursor, limit=5)


def test_minutes_long_past_are_counted_once(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: completions in every minute of the hour
    now = web.sagas.engine.now()
    store = web.sagas.store
    for minute in range(60):
        at = now - minute * 60_000
        record = SagaRecord(f"f-{minute}", "place-order", SagaState.COMPLETED, {}, at, at)
        store.create(CODEC.saga_envelope(record))
    source = source_of(web)
    first = source.overview().finishes
    windows: list[tuple[int, int]] = []
    real = store.count

    def count(*args: Any, **kwargs: Any) -> int:
        if kwargs.get("updated_after_ms") is not None:
            windows.append((kwargs["updated_after_ms"], kwargs["updated_before_ms"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "count", count)

    # when: a late write lands in the last minute, and the page is shown again
    late = SagaRecord("late", "place-order", SagaState.COMPLETED, {}, now, now)
    store.create(CODEC.saga_envelope(late))
    again = source.overview().finishes

    # then: the same figures plus the late one, from the recent minutes' counts only
    assert sum(first.completed) == 60 and sum(again.completed) == 61
    minutes = [w for w in windows if w[1] - w[0] == 60_000]
    assert 0 < len(minutes) <= 3
    assert all(begin + 60_000 > now - 120_000 for begin, _ in minutes)
