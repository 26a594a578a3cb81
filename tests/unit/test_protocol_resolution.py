"""Operator resolution: every outcome x step state x effect id x saga context."""

from __future__ import annotations

import itertools

import pytest

from celery_sagas._protocol import codes
from celery_sagas._protocol.resolution import Resolution, resolve
from celery_sagas._records import SagaRecord, SagaState, StepState
from celery_sagas.errors import SagaResolutionError, SagaValidationError

from .protocol_builders import (
    AM,
    AMBIGUOUS_VARIANTS,
    CF,
    CM,
    CONTEXTS,
    NOW,
    OPEN,
    P1,
    PA,
    VARIANTS,
    cx,
    frozen_copy,
    fx,
    in_context,
    saga,
    step,
)

R = Resolution
SS = SagaState
MAX = 3
RESULT = {"charge": "ch_9"}
EFFECTS = {"execution": fx("s"), "compensation": cx("s"), "stale": "fx-old"}

SETTLES = {
    R.COMMITTED: ("execution", {AM}),
    R.NOT_COMMITTED: ("execution", {AM}),
    # A compensator still running (claimed, not judged ambiguous) cannot be settled by hand.
    R.COMPENSATED: ("compensation", {PA, CF}),
    R.NOT_COMPENSATED: ("compensation", {PA}),
}
STEP_AFTER = {
    R.COMMITTED: StepState.COMMITTED,
    R.NOT_COMMITTED: StepState.FAILED,
    R.COMPENSATED: StepState.COMPENSATED,
    R.NOT_COMPENSATED: StepState.COMPENSATION_FAILED,
}


def legal(context: str, variant: str, outcome: Resolution, effect: str) -> bool:
    """Whether the operator may settle this outcome here."""
    which, variants = SETTLES[outcome]
    return context in OPEN and effect == which and variant in variants


def expected_state(context: str, variant: str, outcome: Resolution) -> SagaState:
    """The saga state after a legal resolution."""
    state, rolling = CONTEXTS[context]
    rolling = rolling or outcome is R.NOT_COMMITTED
    if state is SS.MANUAL_REVIEW:
        if variant not in AMBIGUOUS_VARIANTS:  # reviewed for another reason: stays in review
            return state
        return SS.COMPENSATING if rolling else SS.RUNNING
    if state is SS.RUNNING and rolling:
        return SS.COMPENSATING
    return state


def settle(record: SagaRecord, outcome: object, effect: str, **extra: object) -> SagaRecord:
    """Resolve step ``s`` as the operator found it."""
    return resolve(record, "s", effect, outcome, now_ms=NOW, max_compensation_attempts=MAX,
                   result=RESULT, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize("outcome", list(R), ids=str)
@pytest.mark.parametrize("context", CONTEXTS)
def test_resolution_table(context: str, outcome: Resolution) -> None:
    failures = []
    for variant, effect in itertools.product(VARIANTS, sorted(EFFECTS)):
        try:
            check_resolution(context, variant, outcome, effect)
        except (Exception, pytest.fail.Exception) as exc:
            failures.append(f"{variant} with the {effect} id: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)


def check_resolution(context: str, variant: str, outcome: Resolution, effect: str) -> None:
    """One cell of the resolution table."""
    record = in_context(context, variant)
    before = frozen_copy(record)
    if not legal(context, variant, outcome, effect):
        with pytest.raises(SagaResolutionError):
            settle(record, outcome, EFFECTS[effect])
        assert record == before
        return
    after = settle(record, str(outcome), EFFECTS[effect])
    assert record == before
    assert after.version == record.version + 1
    assert after.updated_at_ms == NOW
    (moved,) = after.steps
    assert moved.state is STEP_AFTER[outcome]
    assert after.state is expected_state(context, variant, outcome)
    if outcome is R.COMMITTED:
        assert (moved.result, moved.committed_at_ms) == (RESULT, NOW)
    if outcome is R.NOT_COMMITTED:
        assert moved.error_code == codes.NOT_COMMITTED
        assert after.rolling_back
    if outcome is R.NOT_COMPENSATED:
        assert moved.error_code == codes.COMPENSATION_FAILED
        assert moved.compensation_attempts == record.steps[0].compensation_attempts


def test_not_committed_records_the_operator_code() -> None:
    record = saga(step(CM, "a"), step(AM, "s"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP, reason="x")
    after = settle(record, "not-committed", fx("s"), error_code="card_declined")
    assert after.steps[1].error_code == "card_declined"
    assert after.state is SS.COMPENSATING
    assert after.error_code == "card_declined"


def test_committed_returns_the_saga_to_running() -> None:
    record = saga(step(CM, "a"), step(AM, "s"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP, reason="x")
    after = settle(record, R.COMMITTED, fx("s"))
    assert after.state is SS.RUNNING
    assert after.steps[1].result == RESULT
    assert after.steps[0] == record.steps[0]


def test_not_compensated_with_attempts_exhausted_stays_in_review() -> None:
    record = saga(step(PA, "s", compensation_attempts=MAX), state=SS.MANUAL_REVIEW, rolling_back=True,
                  error_code=codes.AMBIGUOUS_COMPENSATION, reason="x")
    after = settle(record, "not-compensated", cx("s"))
    assert after.state is SS.MANUAL_REVIEW
    assert after.error_code == codes.COMPENSATION_EXHAUSTED
    assert after.version == record.version + 1
    assert after.steps[0].state is StepState.COMPENSATION_FAILED


def test_not_compensated_with_attempts_left_returns_to_compensating() -> None:
    record = saga(step(PA, "s", compensation_attempts=MAX - 1), state=SS.MANUAL_REVIEW,
                  rolling_back=True, error_code=codes.AMBIGUOUS_COMPENSATION, reason="x")
    after = settle(record, "not-compensated", cx("s"))
    assert after.state is SS.COMPENSATING
    assert after.steps[0].next_attempt_at_ms is not None


def test_not_compensated_of_an_ambiguous_compensator_at_the_limit_stays_in_review() -> None:
    record = saga(step(PA, "s", compensation_attempts=MAX), state=SS.MANUAL_REVIEW,
                  rolling_back=True, error_code=codes.AMBIGUOUS_COMPENSATION, reason="x")
    after = settle(record, "not-compensated", cx("s"))
    assert after.state is SS.MANUAL_REVIEW
    assert after.error_code == codes.COMPENSATION_EXHAUSTED


def test_a_running_compensator_cannot_be_settled_by_hand() -> None:
    record = saga(step(P1, "s", compensation_attempts=MAX), state=SS.COMPENSATING)
    with pytest.raises(SagaResolutionError):
        settle(record, "not-compensated", cx("s"))


def test_compensated_by_hand_after_exhaustion_keeps_review_until_resume() -> None:
    record = saga(step(CF, "s", compensation_attempts=MAX), state=SS.MANUAL_REVIEW, rolling_back=True,
                  error_code=codes.COMPENSATION_EXHAUSTED, reason="x")
    after = settle(record, "compensated", cx("s"))
    assert after.steps[0].state is StepState.COMPENSATED
    assert after.state is SS.MANUAL_REVIEW
    assert after.version == record.version + 1


@pytest.mark.parametrize("outcome", ["COMMITTED", "commit", "", None, 3, "ambiguous"], ids=repr)
def test_a_bad_outcome_is_refused(outcome: object) -> None:
    record = in_context("review-forward", AM)
    before = frozen_copy(record)
    with pytest.raises(SagaResolutionError):
        settle(record, outcome, fx("s"))
    assert record == before


def test_an_unknown_step_is_refused() -> None:
    record = in_context("review-forward", AM)
    with pytest.raises(SagaResolutionError):
        resolve(record, "nope", fx("s"), "committed", now_ms=NOW, max_compensation_attempts=MAX)


@pytest.mark.parametrize("state", [SS.COMPLETED, SS.COMPENSATED])
def test_a_final_saga_refuses_every_resolution(state: SagaState) -> None:
    record = saga(step(AM, "s"), step(PA, "t"), state=state)
    for name, outcome, effect in (("s", R.COMMITTED, fx("s")), ("t", R.COMPENSATED, cx("t"))):
        with pytest.raises(SagaResolutionError):
            resolve(record, name, effect, outcome, now_ms=NOW, max_compensation_attempts=MAX)


@pytest.mark.parametrize("code", ["Card Declined", "", "9x"])
def test_an_invalid_operator_code_changes_nothing(code: str) -> None:
    record = in_context("review-forward", AM)
    before = frozen_copy(record)
    with pytest.raises((SagaValidationError, SagaResolutionError)):
        settle(record, "not-committed", fx("s"), error_code=code)
    assert record == before


def test_a_stale_review_cannot_settle_a_later_attempt() -> None:
    record = in_context("review-forward", AM)
    with pytest.raises(SagaResolutionError, match="effect id"):
        settle(record, "committed", "fx-previous-attempt")
