"""The event bus: lifecycle events and findings reach their observers and
``logging``, with structured ``extra`` fields and a level that says how urgent they are."""

from __future__ import annotations

import logging

import pytest

from celery_sagas._events import EventBus, FindingEvent, LifecycleEvent, Stage, effect_stage
from celery_sagas._records import StepState


def lifecycle(phase: str = "committed", **changes: object) -> LifecycleEvent:
    fields: dict[str, object] = {
        "effect_id": "fx-1", "capability": "orders.charge", "stage": "execution", "phase": phase,
        "attempt": 1, "saga_id": "order-42", "definition": "place-order", "step": "charge",
        "error_code": None, "duration_ms": 12,
    }
    fields.update(changes)
    return LifecycleEvent(**fields)  # type: ignore[arg-type]


def finding(kind: str = "manual-review", **changes: object) -> FindingEvent:
    fields: dict[str, object] = {
        "kind": kind, "record_kind": "saga", "record_id": "order-42", "state": "manual-review",
        "step": "charge", "effect_id": "fx-1", "error_code": "step_error", "updated_at_ms": 5,
        "fence": 7,
    }
    fields.update(changes)
    return FindingEvent(**fields)  # type: ignore[arg-type]


@pytest.fixture
def bus() -> EventBus:
    return EventBus()


# ------------------------------------------------------------------ observers


def test_a_lifecycle_event_reaches_every_lifecycle_observer(bus: EventBus) -> None:
    first: list[LifecycleEvent] = []
    second: list[LifecycleEvent] = []
    bus.subscribe(first.append)
    bus.subscribe(second.append)

    bus.emit(lifecycle())

    assert first == second == [lifecycle()]


def test_a_finding_reaches_finding_observers_and_no_lifecycle_observer(bus: EventBus) -> None:
    events: list[LifecycleEvent] = []
    findings: list[FindingEvent] = []
    bus.subscribe(events.append)
    bus.subscribe_findings(findings.append)

    bus.report(finding())

    assert (events, findings) == ([], [finding()])


def test_an_unsubscribed_observer_receives_nothing_more(bus: EventBus) -> None:
    seen: list[LifecycleEvent] = []
    found: list[FindingEvent] = []
    unsubscribe = bus.subscribe(seen.append)
    unsubscribe_findings = bus.subscribe_findings(found.append)
    unsubscribe()
    unsubscribe_findings()
    unsubscribe()  # twice is harmless

    bus.emit(lifecycle())
    bus.report(finding())

    assert (seen, found) == ([], [])


def test_a_raising_observer_is_logged_and_the_others_still_receive_the_event(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: object) -> None:
        raise RuntimeError("observer bug")

    seen: list[FindingEvent] = []
    bus.subscribe_findings(broken)
    bus.subscribe_findings(seen.append)

    bus.report(finding())

    assert seen == [finding()]
    assert any(r.levelno == logging.ERROR and "observer" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ logging


def test_a_lifecycle_event_is_logged_with_structured_fields(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_sagas.events")

    bus.emit(lifecycle("failed", error_code="card_declined"))

    [record] = caplog.records
    assert record.name == "celery_sagas.events"
    fields = {k: getattr(record, k) for k in (
        "saga_id", "saga_definition", "saga_step", "effect_id", "effect_capability",
        "effect_stage", "effect_phase", "effect_attempt", "error_code", "duration_ms")}
    assert fields == {
        "saga_id": "order-42", "saga_definition": "place-order", "saga_step": "charge",
        "effect_id": "fx-1", "effect_capability": "orders.charge", "effect_stage": "execution",
        "effect_phase": "failed", "effect_attempt": 1, "error_code": "card_declined",
        "duration_ms": 12,
    }
    assert "order-42" in record.getMessage() and "card_declined" in record.getMessage()


@pytest.mark.parametrize(
    ("phase", "level"),
    [("intent", logging.DEBUG), ("executing", logging.DEBUG), ("committed", logging.INFO),
     ("failed", logging.INFO), ("ambiguous", logging.WARNING)],
)
def test_the_log_level_of_a_lifecycle_event_follows_its_phase(
    bus: EventBus, caplog: pytest.LogCaptureFixture, phase: str, level: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_sagas.events")

    bus.emit(lifecycle(phase))

    assert [r.levelno for r in caplog.records] == [level]


def test_a_finding_is_logged_with_structured_fields(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_sagas.findings")

    bus.report(finding("ambiguous-execution"))

    [record] = caplog.records
    assert (record.name, record.levelno) == ("celery_sagas.findings", logging.WARNING)
    fields = {k: getattr(record, k) for k in (
        "finding_kind", "record_kind", "record_id", "record_state", "saga_step", "effect_id",
        "error_code", "updated_at_ms", "sweep_fence")}
    assert fields == {
        "finding_kind": "ambiguous-execution", "record_kind": "saga", "record_id": "order-42",
        "record_state": "manual-review", "saga_step": "charge", "effect_id": "fx-1",
        "error_code": "step_error", "updated_at_ms": 5, "sweep_fence": 7,
    }


@pytest.mark.parametrize(
    ("kind", "state", "level"),
    [("stale", "running", logging.INFO), ("incomplete", "admission", logging.INFO),
     ("corrupt", None, logging.ERROR), ("manual-review", "manual-review", logging.WARNING),
     ("ambiguous", "unknown", logging.WARNING),
     ("ambiguous-execution", "manual-review", logging.WARNING),
     ("ambiguous-execution", "running", logging.INFO),
     ("ambiguous-compensation", "compensating", logging.INFO)],
)
def test_the_log_level_of_a_finding_says_whether_an_operator_is_needed(
    bus: EventBus, caplog: pytest.LogCaptureFixture, kind: str, state: str | None, level: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_sagas.findings")

    bus.report(finding(kind, state=state))

    assert [r.levelno for r in caplog.records] == [level]


# ------------------------------------------------------------------ effect stage


@pytest.mark.parametrize(
    ("stage", "step_state", "expected"),
    [
        (Stage.EXECUTION, StepState.COMMITTED, Stage.EXECUTION),
        (Stage.COMPENSATION, StepState.COMPENSATION_FAILED, Stage.COMPENSATION),
        (Stage.RECONCILIATION, StepState.COMMITTED, Stage.EXECUTION),
        (Stage.RECONCILIATION, StepState.FAILED, Stage.EXECUTION),
        (Stage.RECONCILIATION, StepState.COMPENSATED, Stage.COMPENSATION),
        (Stage.RECONCILIATION, StepState.COMPENSATION_FAILED, Stage.COMPENSATION),
    ],
)
def test_a_resolution_settles_the_effect_its_outcome_is_about(
    stage: str, step_state: StepState, expected: str
) -> None:
    assert effect_stage(stage, step_state) == expected
