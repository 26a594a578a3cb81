"""Paged findings (docs/design.md §6): manual-review, ambiguous and stale sagas, then the
incomplete and ambiguous effects of open sagas (derived from their records, §2.3), each found
exactly once across pages of 1..1000 with an opaque cursor; ``all`` raises instead of
truncating; counts come from the store's indexes."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._codec import Codec
from celery_sagas._findings import FindingPage, Findings, Window, effect_findings, window_of
from celery_sagas._protocol.findings import Finding
from celery_sagas._records import SagaRecord, SagaState, StepRecord
from celery_sagas._scans import Scans
from celery_sagas.errors import SagaValidationError
from celery_sagas.stores.base import Envelope
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, register_shop

from .protocol_builders import AM, P1, X0, X1, step

T0 = 1_700_000_000_000
STALE_BEFORE = T0 + 1_000
IN_FLIGHT_BEFORE = T0 + 500
WINDOW = Window(STALE_BEFORE, IN_FLIGHT_BEFORE)
CODEC = Codec()


def put_saga(store: MemoryStore, saga_id: str, state: SagaState, updated: int = T0,
             steps: tuple[StepRecord, ...] = (), definition: str = "d") -> None:
    record = SagaRecord(saga_id, definition, state, {}, T0, updated, steps,
                        rolling_back=state is SagaState.COMPENSATING)
    assert store.create(CODEC.saga_envelope(record))


def findings_of(store: MemoryStore) -> Findings:
    return Findings(Scans(store, CODEC))


def page_findings(store: MemoryStore, window: Window | None = None, **kwargs: Any) -> FindingPage:
    return findings_of(store).page(window, **kwargs)


def walk(store: MemoryStore, limit: int, report: str = "all", window: Window = WINDOW
         ) -> list[FindingPage]:
    pages = [page_findings(store, window, report=report, limit=limit)]
    while pages[-1].cursor is not None:
        pages.append(page_findings(store, report=report, cursor=pages[-1].cursor, limit=limit))
    return pages


def found(pages: list[FindingPage]) -> list[tuple[str, str, str | None]]:
    return [(str(f.kind), f.record_id, f.effect_id) for page in pages for f in page.findings]


def cursor_of(raw: list[Any]) -> str:
    """A cursor as the findings encode one (to forge old or garbled ones)."""
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


# ------------------------------------------------------------------ what is found


def test_every_kind_of_finding_is_found_and_nothing_else(store: MemoryStore) -> None:
    # given
    put_saga(store, "review", SagaState.MANUAL_REVIEW, updated=T0 + 5_000)
    put_saga(store, "review-unknown", SagaState.MANUAL_REVIEW, steps=(step(AM, "u"),))
    put_saga(store, "stale", SagaState.RUNNING)
    put_saga(store, "admitted", SagaState.RUNNING, updated=T0 + 1, steps=(step(X0, "x"),))
    put_saga(store, "in-flight", SagaState.RUNNING, updated=T0 + 2, steps=(step(X1, "a"),))
    put_saga(store, "running-still", SagaState.RUNNING, updated=T0 + 3,
             steps=(step(X1, "r", started_at_ms=IN_FLIGHT_BEFORE),))
    put_saga(store, "undoing", SagaState.COMPENSATING, updated=T0 + 4, steps=(step(P1, "b"),))
    put_saga(store, "fresh", SagaState.RUNNING, updated=STALE_BEFORE, steps=(step(X0, "f"),))
    put_saga(store, "done", SagaState.COMPLETED)

    # when
    pages = walk(store, limit=100)

    # then: manual review first, then stale sagas, then the effects of both
    assert found(pages) == [
        ("ambiguous-execution", "review-unknown", "fx-u"),
        ("manual-review", "review", None),
        ("stale", "stale", None),
        ("ambiguous-execution", "admitted", "fx-x"),
        ("ambiguous-execution", "in-flight", "fx-a"),
        ("ambiguous-execution", "running-still", "fx-r"),
        ("ambiguous-compensation", "undoing", "cx-b"),
        ("ambiguous", "fx-u", "fx-u"),
        ("incomplete", "fx-x", "fx-x"),
        ("ambiguous", "fx-a", "fx-a"),
        ("ambiguous", "cx-b", "cx-b"),
    ]
    assert len(pages) == 1
    effects = [f for f in pages[0].findings if f.record_kind == "effect"]
    assert [(f.record_kind, f.step, f.state) for f in effects] == [
        ("effect", "u", "unknown"), ("effect", "x", "admission"), ("effect", "a", "executing"),
        ("effect", "b", "executing")]


@pytest.mark.parametrize(("report", "kinds"), [
    ("sagas", ["manual-review", "stale", "ambiguous-execution", "ambiguous-execution"]),
    ("effects", ["incomplete", "ambiguous"]),
])
def test_a_report_of_sagas_or_effects_walks_only_those(
    store: MemoryStore, report: str, kinds: list[str]
) -> None:
    put_saga(store, "review", SagaState.MANUAL_REVIEW)
    put_saga(store, "stale", SagaState.RUNNING)
    put_saga(store, "admitted", SagaState.RUNNING, updated=T0 + 1, steps=(step(X0, "x"),))
    put_saga(store, "unknown", SagaState.RUNNING, updated=T0 + 2, steps=(step(AM, "u"),))

    assert [kind for kind, _, _ in found(walk(store, limit=1, report=report))] == kinds


def test_a_corrupt_record_is_a_finding_and_the_walk_goes_on(store: MemoryStore) -> None:
    # given
    assert store.create(Envelope("saga", "broken", 1, "manual-review", T0, "{not json"))
    put_saga(store, "review", SagaState.MANUAL_REVIEW)

    # when
    findings = [f for page in walk(store, limit=10, report="sagas") for f in page.findings]

    # then
    assert [(str(f.kind), f.record_kind, f.record_id) for f in findings] == [
        ("corrupt", "saga", "broken"), ("manual-review", "saga", "review")]
    assert findings[0].reason is not None and "read validation" in findings[0].reason


def test_the_effects_of_final_sagas_are_never_walked(store: MemoryStore) -> None:
    # given: final sagas whose records still show steps in flight (only an open saga has open
    # effects: the walk reads the open sagas' indexes only)
    put_saga(store, "done", SagaState.COMPLETED, steps=(step(X1, "a"),))
    put_saga(store, "undone", SagaState.COMPENSATED, steps=(step(AM, "u"),))

    # then
    assert found(walk(store, limit=10)) == []


@pytest.mark.parametrize(("variant", "moved", "kind"), [
    (X0, {"dispatched_at_ms": STALE_BEFORE - 1}, "incomplete"),
    (X0, {"dispatched_at_ms": STALE_BEFORE}, None),
    (X0, {"dispatched_at_ms": IN_FLIGHT_BEFORE - 1}, "incomplete"),
    (X1, {"started_at_ms": IN_FLIGHT_BEFORE - 1}, "ambiguous"),
    (X1, {"started_at_ms": IN_FLIGHT_BEFORE}, None),
    (P1, {"started_at_ms": IN_FLIGHT_BEFORE - 1}, "ambiguous"),
    (P1, {"started_at_ms": IN_FLIGHT_BEFORE}, None),
])
def test_an_admission_is_judged_on_staleness_and_a_begun_effect_on_the_time_limits(
    variant: str, moved: dict[str, int], kind: str | None
) -> None:
    # given: one effect that moved at the time given (the saga's other effects are final)
    record = SagaRecord("s", "d", SagaState.MANUAL_REVIEW, {}, T0, T0, (step(variant, "e", **moved),),
                        error_code="nondeterministic", reason="review")

    # when
    kinds = [str(f.kind) for f in effect_findings(record, WINDOW)]

    # then
    assert kinds == ([] if kind is None else [kind])


# ------------------------------------------------------------------ paging


def test_thousands_of_findings_are_each_found_once_across_pages(store: MemoryStore) -> None:
    # given
    for n in range(1_200):
        put_saga(store, f"review-{n:05}", SagaState.MANUAL_REVIEW)
    for n in range(900):
        put_saga(store, f"stale-{n:05}", SagaState.RUNNING)
    for n in range(200):
        put_saga(store, f"unknown-{n:05}", SagaState.RUNNING, steps=(step(AM, f"u{n:05}"),))

    # when
    pages = walk(store, limit=1_000)

    # then
    keys = [(kind, record_id) for kind, record_id, _ in found(pages)]
    assert len(keys) == len(set(keys)) == 2_500
    assert [len(p.findings) for p in pages] == [1_000, 1_000, 500]


@pytest.mark.parametrize("limit", [1, 2, 3, 7])
def test_small_pages_cross_every_scan_boundary_without_loss_or_repeat(
    store: MemoryStore, limit: int
) -> None:
    # given: a few records in each scan of the walk
    for n in range(3):
        put_saga(store, f"review-{n}", SagaState.MANUAL_REVIEW, steps=(step(AM, f"m{n}"),))
        put_saga(store, f"stale-{n}", SagaState.COMPENSATING)
        put_saga(store, f"admitted-{n}", SagaState.RUNNING, steps=(step(X0, f"a{n}"),))
        put_saga(store, f"claimed-{n}", SagaState.RUNNING, steps=(step(X1, f"c{n}"),))

    # when
    pages = walk(store, limit=limit)

    # then: 12 saga findings, 9 effect findings
    keys = [(kind, record_id) for kind, record_id, _ in found(pages)]
    assert len(keys) == len(set(keys)) == 21
    assert all(1 <= len(p.findings) <= limit for p in pages[:-1])


def test_a_page_holds_every_effect_of_its_last_saga_and_the_next_page_goes_on(store: MemoryStore) -> None:
    # given: one saga with three unknown effects, then one with a single one
    put_saga(store, "multi", SagaState.MANUAL_REVIEW,
             steps=(step(AM, "a"), step(AM, "b"), step(AM, "c")))
    put_saga(store, "single", SagaState.MANUAL_REVIEW, updated=T0 + 1, steps=(step(AM, "d"),))

    # when
    pages = walk(store, limit=2, report="effects")

    # then: a few more than the limit rather than a saga split across pages
    assert [[f.record_id for f in p.findings] for p in pages] == [["fx-a", "fx-b", "fx-c"], ["fx-d"]]


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


@pytest.mark.parametrize("cursor", [
    "", "not-base64!", "bnVsbA", "W10", 5, "x" * 5_000,
    "WzEsImFsbCIsOSxudWxsLDEsMV0",  # version 1: [1, "all", 9, null, 1, 1]
    "WzIsImFsbCIsMCxudWxsLDEsMV0",  # [2, "all", 0, null, 1, 1]: no position string
    cursor_of([1, "all", "0:", 1, 1]),  # the version-1 format of today's shape
    cursor_of([2, "all", "9:", 1, 1]),  # no such scan in the walk
    cursor_of([2, "all", "x", 1, 1]),
    cursor_of([2, "all", "0:", -1, 1]),
    cursor_of([2, "approvals", "0:", 1, 1]),
])
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


# ------------------------------------------------------------------ every finding at once


def _up_to_a_thousand(store: MemoryStore, extra: int) -> None:
    """600 sagas in review, 200 stale running ones with an unclaimed step (a saga finding and
    an effect finding each), and ``extra`` more in review."""
    for n in range(600 + extra):
        put_saga(store, f"review-{n:05}", SagaState.MANUAL_REVIEW)
    for n in range(200):
        put_saga(store, f"admitted-{n:05}", SagaState.RUNNING, steps=(step(X0, f"a{n:05}"),))


def test_all_returns_up_to_1000(store: MemoryStore) -> None:
    _up_to_a_thousand(store, 0)
    everything = findings_of(store).all(WINDOW)
    assert len(everything) == len({(str(f.kind), f.record_id) for f in everything}) == 1_000


def test_all_raises_rather_than_truncate_past_1000(store: MemoryStore) -> None:
    _up_to_a_thousand(store, 1)
    with pytest.raises(SagaValidationError, match="more than 1000"):
        findings_of(store).all(WINDOW)


def test_all_of_one_report(store: MemoryStore) -> None:
    _up_to_a_thousand(store, 1)
    assert len(findings_of(store).all(WINDOW, report="effects")) == 200


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


# ------------------------------------------------------------------ counts and browsing


def test_sagas_counts_every_state_exactly_from_the_indexes(sagas: tuple[Sagas, SagaDriver, Script]) -> None:
    # given: two completed orders, one in review, three running, one notify-user completed
    facade, driver, script = sagas
    for saga_id in ("o-1", "o-2"):
        facade.start("place-order", ORDER, saga_id=saga_id)
    driver.run_until_idle()
    script.then("charge", ConnectionError("reset"))
    facade.start("place-order", ORDER, saga_id="o-review")
    driver.run_until_idle()
    for saga_id in ("o-3", "o-4", "o-5"):
        facade.start("place-order", ORDER, saga_id=saga_id)
    driver.take()
    facade.start("notify-user", {"user": "u-1"}, saga_id="n-1")
    driver.run_until_idle()

    # when
    everything = facade.counts()
    orders = facade.counts(definition="place-order")
    nobody = facade.counts(definition="nobody")

    # then
    assert everything == {"running": 3, "compensating": 0, "completed": 3, "compensated": 0,
                          "manual-review": 1}
    assert orders == {**everything, "completed": 2}
    assert set(nobody.values()) == {0} and set(nobody) == set(everything)


def test_sagas_browse_pages_by_state_and_definition(sagas: tuple[Sagas, SagaDriver, Script]) -> None:
    # given
    facade, driver, _ = sagas
    for n in range(3):
        facade.start("place-order", ORDER, saga_id=f"o-{n}")
    facade.start("notify-user", {"user": "u-1"}, saga_id="n-1")
    driver.run_until_idle()
    facade.start("place-order", ORDER, saga_id="o-running")
    driver.take()

    # when
    first = facade.browse(states=["completed"], definition="place-order", limit=2)
    rest = facade.browse(states=["completed"], definition="place-order", cursor=first.cursor, limit=2)
    every = facade.browse(limit=100)

    # then
    assert [r.saga_id for r in (*first.records, *rest.records)] == ["o-0", "o-1", "o-2"]
    assert rest.cursor is None
    assert sorted(r.saga_id for r in every.records) == ["n-1", "o-0", "o-1", "o-2", "o-running"]
    with pytest.raises(SagaValidationError):
        facade.browse(states=["sleeping"])


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
    # given: start recorded reserve's intent and sent it; the message was lost
    facade, driver, _ = sagas
    facade.start("place-order", ORDER, saga_id="o-1")
    assert [m.step for m in driver.take()] == ["shop.reserve"]
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
