"""Reconciliation findings: every rule for effects and sagas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_sagas._protocol import codes
from celery_sagas._protocol.findings import Finding, FindingKind, effect_finding, saga_finding
from celery_sagas._protocol.kinds import TIMER_TASK
from celery_sagas._records import EffectRecord, EffectState, SagaState, StepState

from .protocol_builders import (
    AM,
    AW,
    CD,
    CF,
    CM,
    FL,
    P0,
    P1,
    PA,
    UPDATED,
    X0,
    X1,
    XR,
    cx,
    fx,
    saga,
    step,
)

E = EffectState
K = FindingKind
SS = SagaState
OLD = UPDATED + 1  # stale_before just after the record's last write: it is stale
FRESH = UPDATED  # stale_before equal to the last write: not older, not stale


def effect(state: EffectState) -> EffectRecord:
    """An effect in ``state`` (as the saga record shows it), last moved at UPDATED."""
    return EffectRecord(
        effect_id="fx-1", capability="orders.charge", state=state, created_at_ms=UPDATED - 50,
        updated_at_ms=UPDATED, version=2, tenant_id="t1", principal_id="alice",
        error_code="time_limit", saga_id="order-42", step="charge", stage="execution",
    )


@pytest.mark.parametrize(
    ("state", "kind"),
    [(E.ADMISSION, K.INCOMPLETE), (E.EXECUTING, K.AMBIGUOUS), (E.UNKNOWN, K.AMBIGUOUS),
     (E.COMMITTED, None), (E.FAILED, None)],
    ids=str,
)
def test_effect_rules(state: EffectState, kind: FindingKind | None) -> None:
    found = effect_finding(effect(state), OLD)
    if kind is None:
        assert found is None
        return
    assert found == Finding(kind, "effect", "fx-1", str(state), "charge", "fx-1", "time_limit", None,
                            UPDATED)


@pytest.mark.parametrize("state", list(E), ids=str)
def test_an_effect_not_older_than_stale_before_is_not_reported(state: EffectState) -> None:
    assert effect_finding(effect(state), FRESH) is None
    assert effect_finding(effect(state), UPDATED - 1) is None


OPEN_STATES = [SS.RUNNING, SS.COMPENSATING, SS.MANUAL_REVIEW]


@pytest.mark.parametrize("state", [SS.RUNNING, SS.COMPENSATING], ids=str)
@pytest.mark.parametrize("variant", [X0, X1, XR, AM])
@pytest.mark.parametrize("stale_before", [OLD, FRESH])
def test_an_executing_or_ambiguous_step_of_a_live_saga_is_ambiguous_execution(
    state: SagaState, variant: str, stale_before: int
) -> None:
    record = saga(step(CM, "a"), step(variant, "b"), state=state)
    found = saga_finding(record, stale_before)
    assert found is not None
    assert (found.kind, found.record_kind, found.record_id) == (K.AMBIGUOUS_EXECUTION, "saga", "order-42")
    assert (found.step, found.effect_id, found.state) == ("b", fx("b"), str(state))
    assert (found.error_code, found.reason, found.updated_at_ms) == (
        record.error_code, record.reason, UPDATED)


@pytest.mark.parametrize("stale_before", [OLD, FRESH])
def test_in_review_only_an_ambiguous_step_is_ambiguous_execution(stale_before: int) -> None:
    record = saga(step(CM, "a"), step(AM, "b"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP)
    found = saga_finding(record, stale_before)
    assert found is not None and found.kind is K.AMBIGUOUS_EXECUTION
    assert (found.step, found.effect_id) == ("b", fx("b"))


@pytest.mark.parametrize("variant", [X0, X1, XR, P0, P1])
def test_in_review_a_step_with_no_unknown_outcome_is_no_ambiguity(variant: str) -> None:
    # A nondeterministic run() stopped while steps were sent, never claimed or still running:
    # no provider has anything to say about them; the finding is the review's own code.
    record = saga(step(CM, "a"), step(variant, "b"), state=SS.MANUAL_REVIEW,
                  error_code=codes.NONDETERMINISTIC, reason="replay differs")
    assert saga_finding(record, OLD) == Finding(
        K.MANUAL_REVIEW, "saga", "order-42", "manual-review", None, None,
        codes.NONDETERMINISTIC, "replay differs", UPDATED)


@pytest.mark.parametrize("state", OPEN_STATES, ids=str)
def test_an_ambiguous_compensator_is_ambiguous_compensation(state: SagaState) -> None:
    record = saga(step(CM, "a"), step(PA, "b"), state=state)
    found = saga_finding(record, FRESH)
    assert found is not None
    assert found.kind is K.AMBIGUOUS_COMPENSATION
    assert (found.step, found.effect_id) == ("b", cx("b"))


@pytest.mark.parametrize("state", [SS.RUNNING, SS.COMPENSATING], ids=str)
@pytest.mark.parametrize("variant", [P0, P1, PA])
def test_a_compensating_step_is_ambiguous_compensation(state: SagaState, variant: str) -> None:
    record = saga(step(CM, "a"), step(variant, "b"), state=state)
    found = saga_finding(record, FRESH)
    assert found is not None
    assert found.kind is K.AMBIGUOUS_COMPENSATION
    assert (found.step, found.effect_id) == ("b", cx("b"))


@pytest.mark.parametrize("stale_before", [OLD, FRESH])
def test_an_exhausted_compensation_names_its_step_and_compensation_effect(stale_before: int) -> None:
    record = saga(step(CD, "a"), step(CF, "b"), step(FL, "c"), state=SS.MANUAL_REVIEW,
                  error_code=codes.COMPENSATION_EXHAUSTED, reason="failed 3 times")
    assert saga_finding(record, stale_before) == Finding(
        K.MANUAL_REVIEW, "saga", "order-42", "manual-review", "b", cx("b"),
        codes.COMPENSATION_EXHAUSTED, "failed 3 times", UPDATED)


@pytest.mark.parametrize("variant", [CM, FL, CF, CD, AW])
@pytest.mark.parametrize("stale_before", [OLD, FRESH])
def test_manual_review_without_unknown_steps_is_manual_review(variant: str, stale_before: int) -> None:
    record = saga(step(variant, "a"), state=SS.MANUAL_REVIEW, error_code=codes.RUN_FAILED,
                  reason="failed 3 times")
    assert saga_finding(record, stale_before) == Finding(
        K.MANUAL_REVIEW, "saga", "order-42", "manual-review", None, None,
        codes.RUN_FAILED, "failed 3 times", UPDATED)


def test_manual_review_of_a_saga_without_steps() -> None:
    found = saga_finding(saga(state=SS.MANUAL_REVIEW), FRESH)
    assert found is not None and found.kind is K.MANUAL_REVIEW


@pytest.mark.parametrize("state", [SS.RUNNING, SS.COMPENSATING], ids=str)
@pytest.mark.parametrize("variant", [CM, FL, CF, CD, None])
def test_a_quiet_live_saga_is_stale_only_when_older(state: SagaState, variant: str | None) -> None:
    record = saga(*([] if variant is None else [step(variant, "a")]), state=state)
    found = saga_finding(record, OLD)
    assert found is not None
    assert (found.kind, found.step, found.effect_id) == (K.STALE, None, None)
    assert saga_finding(record, FRESH) is None


def test_a_saga_at_an_approval_gate_waits_and_is_never_stale() -> None:
    assert saga_finding(saga(step(AW, "a"), state=SS.RUNNING), OLD) is None


@pytest.mark.parametrize(("wake_at", "stale"), [(None, False), (OLD, False), (OLD - 1, True)])
def test_a_wait_is_stale_only_once_its_wake_up_is_past_stale_after(wake_at: int | None,
                                                                   stale: bool) -> None:
    waiting = replace(step(CM, "a"), state=StepState.WAITING, task=TIMER_TASK, wake_at_ms=wake_at)
    found = saga_finding(saga(waiting, state=SS.RUNNING), OLD)
    assert (found is not None and found.kind is K.STALE) is stale


@pytest.mark.parametrize("state", [SS.COMPLETED, SS.COMPENSATED], ids=str)
@pytest.mark.parametrize("variant", [X1, AM, P1, CM])
def test_final_sagas_are_never_reported(state: SagaState, variant: str) -> None:
    assert saga_finding(saga(step(variant, "a"), state=state), OLD) is None


def test_the_first_unknown_step_in_order_is_named() -> None:
    record = saga(step(CM, "a"), step(AM, "b"), step(X1, "c"))
    found = saga_finding(record, OLD)
    assert found is not None and found.step == "b"


def test_findings_never_carry_payloads() -> None:
    record = saga(step(AM, "a"))
    found = saga_finding(record, OLD)
    text = repr(found)
    assert "A-1" not in text and "{'id'" not in text
    assert str(K.AMBIGUOUS_EXECUTION) == "ambiguous-execution"
