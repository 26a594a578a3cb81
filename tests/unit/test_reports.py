"""Paged findings (SPEC §5): manual-review, ambiguous and stale sagas, incomplete and
ambiguous effects, each found exactly once across pages of 1..1000 with an opaque cursor;
the non-paged helper raises instead of truncating."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._findings import (
    FindingPage,
    Window,
    all_findings,
    count_sagas,
    page_findings,
    window_of,
)
from celery_sagas._protocol.findings import Finding
from celery_sagas._records import (
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
    effect_to_envelope,
    saga_to_envelope,
)
from celery_sagas.errors import SagaValidationError
from celery_sagas.stores.base import Envelope
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, register_shop

T0 = 1_700_000_000_000
STALE_BEFORE = T0 + 1_000
IN_FLIGHT_BEFORE = T0 + 500
WINDOW = Window(STALE_BEFORE, IN_FLIGHT_BEFORE)


def put_saga(store: MemoryStore, saga_id: str, state: SagaState, updated: int = T0,
             steps: tuple[StepRecord, ...] = ()) -> None:
    assert store.create(saga_to_envelope(SagaRecord(saga_id, "d", state, {}, updated, updated, steps)))


def step(name: str, state: StepState) -> StepRecord:
    return StepRecord(name, "t", f"fx-{name}", f"cx-{name}", state, attempts=1)


def put_effect(store: MemoryStore, effect_id: str, state: EffectState, updated: int = T0) -> None:
    record = EffectRecord(effect_id, "orders.charge", state, updated, updated, saga_id="s", step="x")
    assert store.create(effect_to_envelope(record))


def walk(store: MemoryStore, limit: int, report: str = "all", window: Window = WINDOW
         ) -> list[FindingPage]:
    pages = [page_findings(store, window, report=report, limit=limit)]
    while pages[-1].cursor is not None:
        pages.append(page_findings(store, report=report, cursor=pages[-1].cursor, limit=limit))
    return pages


def found(pages: list[FindingPage]) -> list[tuple[str, str, str | None]]:
    return [(str(f.kind), f.record_id, f.effect_id) for page in pages for f in page.findings]


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


# ------------------------------------------------------------------ what is found


def test_every_kind_of_finding_is_found_and_nothing_else(store: MemoryStore) -> None:
    # given
    put_saga(store, "review", SagaState.MANUAL_REVIEW, updated=T0 + 5_000)
    put_saga(store, "stale", SagaState.RUNNING)
    put_saga(store, "in-flight", SagaState.RUNNING, steps=(step("a", StepState.EXECUTING),))
    put_saga(store, "undoing", SagaState.COMPENSATING, steps=(step("b", StepState.COMPENSATING),))
    put_saga(store, "fresh", SagaState.RUNNING, updated=STALE_BEFORE)
    put_saga(store, "done", SagaState.COMPLETED)
    put_effect(store, "fx-admitted", EffectState.ADMISSION)
    put_effect(store, "fx-admitted-fresh", EffectState.ADMISSION, updated=STALE_BEFORE)
    put_effect(store, "fx-executing", EffectState.EXECUTING)
    put_effect(store, "fx-running-still", EffectState.EXECUTING, updated=IN_FLIGHT_BEFORE)
    put_effect(store, "fx-unknown", EffectState.UNKNOWN)
    put_effect(store, "fx-committed", EffectState.COMMITTED)

    # when
    pages = walk(store, limit=100)

    # then: manual review first, then stale sagas, then effects
    assert found(pages) == [
        ("manual-review", "review", None),
        ("ambiguous-execution", "in-flight", "fx-a"),
        ("stale", "stale", None),
        ("ambiguous-compensation", "undoing", "cx-b"),
        ("incomplete", "fx-admitted", "fx-admitted"),
        ("ambiguous", "fx-executing", "fx-executing"),
        ("ambiguous", "fx-unknown", "fx-unknown"),
    ]
    assert len(pages) == 1


@pytest.mark.parametrize(("report", "kinds"), [
    ("sagas", ["manual-review", "stale"]),
    ("effects", ["incomplete", "ambiguous"]),
])
def test_a_report_of_sagas_or_effects_walks_only_those(
    store: MemoryStore, report: str, kinds: list[str]
) -> None:
    put_saga(store, "review", SagaState.MANUAL_REVIEW)
    put_saga(store, "stale", SagaState.RUNNING)
    put_effect(store, "fx-admitted", EffectState.ADMISSION)
    put_effect(store, "fx-unknown", EffectState.UNKNOWN)

    assert [kind for kind, _, _ in found(walk(store, limit=1, report=report))] == kinds


def test_a_corrupt_record_is_a_finding_and_the_walk_goes_on(store: MemoryStore) -> None:
    # given
    assert store.create(Envelope("saga", "broken", 1, "manual-review", T0, "{not json"))
    put_saga(store, "review", SagaState.MANUAL_REVIEW)

    # when
    findings = [f for page in walk(store, limit=10) for f in page.findings]

    # then
    assert [(str(f.kind), f.record_kind, f.record_id) for f in findings] == [
        ("corrupt", "saga", "broken"), ("manual-review", "saga", "review")]
    assert findings[0].reason is not None and "read validation" in findings[0].reason


# ------------------------------------------------------------------ paging


def test_thousands_of_findings_are_each_found_once_across_pages(store: MemoryStore) -> None:
    # given
    for n in range(1_200):
        put_saga(store, f"review-{n:05}", SagaState.MANUAL_REVIEW)
    for n in range(900):
        put_saga(store, f"stale-{n:05}", SagaState.RUNNING)
    for n in range(400):
        put_effect(store, f"fx-{n:05}", EffectState.UNKNOWN)

    # when
    pages = walk(store, limit=1_000)

    # then
    ids = [record_id for _, record_id, _ in found(pages)]
    assert len(ids) == len(set(ids)) == 2_500
    assert [len(p.findings) for p in pages] == [1_000, 1_000, 500]


@pytest.mark.parametrize("limit", [1, 2, 3, 7])
def test_small_pages_cross_every_scan_boundary_without_loss_or_repeat(
    store: MemoryStore, limit: int
) -> None:
    # given: a few records in each scan of the walk
    for n in range(3):
        put_saga(store, f"review-{n}", SagaState.MANUAL_REVIEW)
        put_saga(store, f"stale-{n}", SagaState.COMPENSATING)
        put_effect(store, f"fx-a-{n}", EffectState.ADMISSION)
        put_effect(store, f"fx-x-{n}", EffectState.EXECUTING)

    # when
    pages = walk(store, limit=limit)

    # then
    ids = [record_id for _, record_id, _ in found(pages)]
    assert len(ids) == len(set(ids)) == 12
    assert all(1 <= len(p.findings) <= limit for p in pages[:-1])


def test_later_pages_judge_against_the_window_of_the_first(store: MemoryStore) -> None:
    # given: two stale sagas; the second is stale only by the first page's window
    put_saga(store, "a", SagaState.RUNNING, updated=T0)
    put_saga(store, "b", SagaState.RUNNING, updated=STALE_BEFORE - 1)
    first = page_findings(store, WINDOW, report="sagas", limit=1)
    assert first.cursor is not None

    # when
    second = page_findings(store, report="sagas", cursor=first.cursor, limit=1)

    # then
    assert [f.record_id for f in (*first.findings, *second.findings)] == ["a", "b"]


def test_an_empty_store_has_one_empty_last_page(store: MemoryStore) -> None:
    assert page_findings(store, WINDOW) == FindingPage((), None)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("limit", [0, 1_001, -1, True, "10", 2.5])
def test_a_limit_outside_1_to_1000_is_refused(store: MemoryStore, limit: Any) -> None:
    with pytest.raises(SagaValidationError):
        page_findings(store, WINDOW, limit=limit)


@pytest.mark.parametrize("cursor", ["", "not-base64!", "bnVsbA", "W10", "WzEsImFsbCIsOSxudWxsLDEsMV0",
                                    "WzIsImFsbCIsMCxudWxsLDEsMV0", 5])
def test_a_malformed_cursor_is_refused(store: MemoryStore, cursor: Any) -> None:
    with pytest.raises(SagaValidationError):
        page_findings(store, cursor=cursor)


def test_a_cursor_cannot_continue_another_report_or_window(store: MemoryStore) -> None:
    for n in range(2):
        put_saga(store, f"review-{n}", SagaState.MANUAL_REVIEW)
    cursor = page_findings(store, WINDOW, report="sagas", limit=1).cursor
    assert cursor is not None

    with pytest.raises(SagaValidationError):
        page_findings(store, report="effects", cursor=cursor)
    with pytest.raises(SagaValidationError):
        page_findings(store, Window(1, 1), report="sagas", cursor=cursor)
    assert page_findings(store, WINDOW, report="sagas", cursor=cursor).findings


def test_a_first_page_needs_a_window_and_a_known_report(store: MemoryStore) -> None:
    with pytest.raises(SagaValidationError):
        page_findings(store)
    with pytest.raises(SagaValidationError):
        page_findings(store, WINDOW, report="approvals")


# ------------------------------------------------------------------ the non-paged helper


def test_all_findings_returns_up_to_1000(store: MemoryStore) -> None:
    for n in range(600):
        put_saga(store, f"review-{n:05}", SagaState.MANUAL_REVIEW)
    for n in range(400):
        put_effect(store, f"fx-{n:05}", EffectState.ADMISSION)

    assert len(all_findings(store, WINDOW)) == 1_000


def test_all_findings_raises_rather_than_truncate_past_1000(store: MemoryStore) -> None:
    for n in range(600):
        put_saga(store, f"review-{n:05}", SagaState.MANUAL_REVIEW)
    for n in range(401):
        put_effect(store, f"fx-{n:05}", EffectState.ADMISSION)

    with pytest.raises(SagaValidationError, match="more than 1000"):
        all_findings(store, WINDOW)


# ------------------------------------------------------------------ counts


def test_count_sagas_counts_each_open_state_up_to_its_cap(store: MemoryStore) -> None:
    for n in range(5):
        put_saga(store, f"r-{n}", SagaState.RUNNING)
    put_saga(store, "m-1", SagaState.MANUAL_REVIEW)
    put_saga(store, "c-1", SagaState.COMPLETED)

    assert count_sagas(store) == {"running": 5, "compensating": 0, "manual-review": 1}
    assert count_sagas(store, cap=3) == {"running": 3, "compensating": 0, "manual-review": 1}
    with pytest.raises(SagaValidationError):
        count_sagas(store, cap=0)


# ------------------------------------------------------------------ through Sagas


@pytest.fixture
def sagas() -> tuple[Sagas, SagaDriver, Script]:
    app = Celery(f"reports-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True, clock=FrozenClock())
    script = Script()
    register_shop(sagas, script)
    return sagas, SagaDriver(sagas), script


def test_the_window_waits_for_the_longest_time_limit_before_calling_an_effect_ambiguous(
    sagas: tuple[Sagas, SagaDriver, Script],
) -> None:
    facade, _, _ = sagas

    @facade.step(name="slow.export", compensate=None, time_limit=900)
    def export() -> None:
        return None

    timing = facade.settings.timing
    assert window_of(facade.engine, T0) == Window(T0 - timing.stale_ms, T0 - 900_000 - timing.grace_ms)


def test_sagas_findings_pages_what_needs_an_operator(sagas: tuple[Sagas, SagaDriver, Script]) -> None:
    # given: two orders whose charge outcome is unknown
    facade, driver, script = sagas
    script.then("charge", ConnectionError("reset"), ConnectionError("reset"))
    for saga_id in ("o-1", "o-2"):
        facade.start("place-order", ORDER, saga_id=saga_id)
    driver.run_until_idle()

    # when
    first = facade.findings("sagas", limit=1)
    assert first.cursor is not None
    second = facade.findings("sagas", cursor=first.cursor, limit=1)

    # then
    pairs = [(str(f.kind), f.record_id) for f in (*first.findings, *second.findings)]
    assert sorted(pairs) == [("ambiguous-execution", "o-1"), ("ambiguous-execution", "o-2")]
    everything: list[Finding] = facade.all_findings()
    assert {f.record_id for f in everything} >= {"o-1", "o-2"}
    with pytest.raises(SagaValidationError):
        facade.findings(limit=0)


# ------------------------------------------------------------------ what the sweep reports


def test_a_sweep_reports_each_finding_and_corrupt_record_as_an_event_and_a_log_line(
    sagas: tuple[Sagas, SagaDriver, Script], caplog: pytest.LogCaptureFixture
) -> None:
    # given: an order in manual review (charge unknown), its effect past every time limit,
    # and a corrupt record
    facade, driver, script = sagas
    script.then("charge", ConnectionError("reset"))
    facade.start("place-order", ORDER, saga_id="o-1")
    driver.run_until_idle()
    effect_id = facade.engine.load("o-1").steps[1].effect_id
    assert facade.store.create(Envelope("saga", "broken", 1, "manual-review", T0, "{not json"))
    clock = facade.engine.clock
    assert isinstance(clock, FrozenClock)
    timing = facade.settings.timing
    clock.advance(timing.default_time_limit_ms + timing.grace_ms + 1)
    seen: list[Any] = []
    facade.subscribe_findings(seen.append)
    caplog.set_level(logging.INFO, logger="celery_sagas.findings")

    # when
    report = facade.sweep()

    # then
    reported = sorted((e.kind, e.record_kind, e.record_id, e.effect_id, e.fence) for e in seen)
    assert reported == [
        ("ambiguous", "effect", effect_id, effect_id, report.fence),
        ("ambiguous-execution", "saga", "o-1", effect_id, report.fence),
        ("corrupt", "saga", "broken", None, report.fence),
    ]
    logged = sorted((r.levelno, getattr(r, "finding_kind", None), getattr(r, "record_id", None))
                    for r in caplog.records if r.name == "celery_sagas.findings")
    assert logged == [(logging.WARNING, "ambiguous", effect_id),
                      (logging.WARNING, "ambiguous-execution", "o-1"),
                      (logging.ERROR, "corrupt", "broken")]


def test_a_lost_step_message_leaves_an_incomplete_effect_that_the_sweep_reports(
    sagas: tuple[Sagas, SagaDriver, Script],
) -> None:
    # given: reserve's intent is journaled, its message lost
    facade, driver, _ = sagas
    facade.start("place-order", ORDER, saga_id="o-1")
    for message in driver.take():
        driver.deliver(message)
    driver.take()
    effect_id = facade.engine.load("o-1").steps[0].effect_id
    clock = facade.engine.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(facade.settings.timing.stale_ms + 1)

    # when
    report = facade.sweep()

    # then: the step is sent again, and its effect reported as not yet begun
    assert ("incomplete", effect_id) in [(str(f.kind), f.record_id) for f in report.findings]
    assert [m.step for m in driver.take()] == ["shop.reserve"]


def test_a_sweep_with_nothing_to_report_reports_nothing(sagas: tuple[Sagas, SagaDriver, Script]) -> None:
    facade, driver, _ = sagas
    facade.start("place-order", ORDER, saga_id="o-1")
    driver.run_until_idle()
    seen: list[Any] = []
    facade.subscribe_findings(seen.append)

    facade.sweep()

    assert seen == []
