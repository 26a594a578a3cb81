"""Lifecycle events: every effect transition is an event (ids, stage, phase, attempt,
error code) sent to observers and logging, and none of them, nor any log record, carries the
saga input, step arguments, results or exception messages."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._events import LifecycleEvent
from tests.engine.conftest import Shop

MARKERS = ("MARKER-INPUT", "MARKER-ARG", "MARKER-RESULT", "MARKER-EXC")


def _phases(events: list[LifecycleEvent], effect_id: str) -> list[tuple[str, str]]:
    return [(e.stage, e.phase) for e in events if e.effect_id == effect_id]


def test_a_committed_step_emits_intent_executing_committed(shop: Shop, events: list[LifecycleEvent]) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    effect_id = shop.step("shop.charge").effect_id
    assert _phases(events, effect_id) == [
        ("execution", "intent"), ("execution", "executing"), ("execution", "committed"),
    ]


def test_an_event_names_the_saga_step_capability_and_attempt(
    shop: Shop, events: list[LifecycleEvent]
) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.charge")
    committed = next(e for e in events if e.effect_id == step.effect_id and e.phase == "committed")
    assert (committed.saga_id, committed.definition, committed.step) == ("o-1", "place-order", "shop.charge")
    assert committed.capability == "saga.execute"
    assert committed.attempt == 1 and committed.error_code is None


def test_a_known_failure_emits_failed_with_its_error_code(shop: Shop, events: list[LifecycleEvent]) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    failed = [e for e in events if e.effect_id == shop.step("shop.ship").effect_id][-1]
    assert (failed.phase, failed.error_code) == ("failed", "out_of_stock")


def test_an_unknown_failure_emits_ambiguous(shop: Shop, events: list[LifecycleEvent]) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    effect_id = shop.step("shop.charge").effect_id
    assert _phases(events, effect_id)[-1] == ("execution", "ambiguous")


def test_a_compensation_emits_events_under_the_compensation_effect_id(
    shop: Shop, events: list[LifecycleEvent]
) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.script.then("release", RuntimeError("inventory down"))
    shop.start_order()
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    effect_id = shop.step("shop.reserve").compensation_effect_id
    assert _phases(events, effect_id) == [
        ("compensation", "intent"), ("compensation", "executing"), ("compensation", "failed"),
        ("compensation", "intent"), ("compensation", "executing"), ("compensation", "committed"),
    ]
    attempts = [e.attempt for e in events if e.effect_id == effect_id]
    assert attempts == [1, 1, 1, 2, 2, 2]


def test_an_observer_that_raises_does_not_disturb_the_saga(shop: Shop) -> None:
    # given
    def broken(_: LifecycleEvent) -> None:
        raise RuntimeError("observer bug")

    shop.sagas.subscribe(broken)
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == "completed"


def test_an_unsubscribed_observer_receives_nothing_more(shop: Shop) -> None:
    # given
    seen: list[LifecycleEvent] = []
    unsubscribe = shop.sagas.subscribe(seen.append)
    unsubscribe()
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    assert seen == []


def _run_every_kind_of_outcome(shop: Shop) -> None:
    """Sagas with marked payloads: one completes, one compensates (with a failing compensator),
    one goes ambiguous, one diverges in replay, one crashes in run()."""
    shop.script.then("reserve", {"reservation": "MARKER-RESULT-r1"}, {"reservation": "MARKER-RESULT-r2"})
    shop.script.then("ship", StepNotCommitted("out_of_stock", "MARKER-EXC-ship"))
    shop.script.then("refund", RuntimeError("MARKER-EXC-refund"))
    shop.start_order("m-1", sku="MARKER-ARG-sku", note="MARKER-INPUT-note")
    shop.driver.run_until_idle()
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    shop.script.then("charge", ConnectionError("MARKER-EXC-charge"))
    shop.start_order("m-2", card="MARKER-ARG-card", note="MARKER-INPUT-note")
    shop.driver.run_until_idle()

    @shop.sagas.saga("marked-crash")
    def crash(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(shop.tasks["notify"], "MARKER-ARG-user")
        raise ValueError(f"MARKER-EXC-run {data}")

    crash.start({"secret": "MARKER-INPUT-crash"}, saga_id="m-3")
    shop.driver.run_until_idle()
    shop.sagas.sweep()


def _leaks(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


def test_no_lifecycle_event_carries_input_args_results_or_exception_text(
    shop: Shop, events: list[LifecycleEvent]
) -> None:
    # when
    _run_every_kind_of_outcome(shop)

    # then: every phase appeared, and no event carries a marker
    phases = {(e.stage, e.phase) for e in events}
    for phase in ("intent", "executing", "committed", "failed", "ambiguous"):
        assert ("execution", phase) in phases
    for phase in ("intent", "executing", "committed", "failed"):
        assert ("compensation", phase) in phases
    assert [e for e in events if _leaks(repr(asdict(e)))] == []


def test_no_log_record_carries_input_args_or_results_and_only_tracebacks_carry_exception_text(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    # given
    caplog.set_level(logging.DEBUG)

    # when
    _run_every_kind_of_outcome(shop)

    # then: the library's own messages, arguments and extra fields are clean; what user code
    # raised appears only in the traceback of the ERROR line reporting it (issue 16 item 10)
    assert caplog.records, "the engine logs its lifecycle"
    formatter = logging.Formatter()
    leaking = [
        (record.name, record.getMessage())
        for record in caplog.records
        if _leaks(record.getMessage() + repr({k: v for k, v in record.__dict__.items()
                                              if k not in ("exc_info", "exc_text")}))
    ]
    assert leaking == []
    errors = [r for r in caplog.records if r.levelname == "ERROR" and r.exc_info]
    for raised in ("MARKER-EXC-refund", "MARKER-EXC-charge", "MARKER-EXC-run"):
        assert any(raised in formatter.formatException(r.exc_info) for r in errors), raised
