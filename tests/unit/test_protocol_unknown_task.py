"""``moves.unknown_task`` over every (saga context, step variant, effect) and the resolutions
it makes possible (issue 16 item 1): only an unclaimed effect of a live saga going that way is
taken; everything else is refused and left unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.resolution import resolve
from celery_sagas._records import SagaRecord, SagaState, StepState
from tests.unit.protocol_builders import (
    COMPENSATING,
    CONTEXTS,
    NOW,
    P0,
    RUNNING,
    VARIANTS,
    X0,
    XR,
    assert_refused,
    cx,
    frozen_copy,
    fx,
    in_context,
)

# (context, variant, compensation effect?) -> the move is legal: an effect nobody claimed (a
# first attempt, or the retry of an idempotent step, released) of a saga going that way
LEGAL = {(RUNNING, X0, False), (RUNNING, XR, False), (COMPENSATING, P0, True)}


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("compensation", [False, True], ids=["step-task", "compensator"])
def test_unknown_task_table(context: str, variant: str, compensation: bool) -> None:
    record = in_context(context, variant)
    effect = cx("s") if compensation else fx("s")

    def apply(saga: SagaRecord) -> object:
        return moves.unknown_task(saga, "s", effect, "task.s", NOW)

    if (context, variant, compensation) not in LEGAL:
        assert_refused(apply, record)
        return
    before = frozen_copy(record)
    after = moves.unknown_task(record, "s", effect, "task.s", NOW)
    assert record == before  # never mutates its input
    assert after.version == record.version + 1 and after.updated_at_ms == NOW
    assert (after.state, after.error_code) == (SagaState.MANUAL_REVIEW, codes.UNKNOWN_TASK)
    assert "task.s" in (after.reason or "") and effect in (after.reason or "")
    step = after.step("s")
    assert step is not None
    assert step.error_code == codes.UNKNOWN_TASK
    assert (step.state, step.started_at_ms) == (record.steps[0].state, None)
    assert moves.unresolved_ambiguity(after) is None  # resume is allowed


def test_an_unknown_effect_id_is_refused() -> None:
    record = in_context(RUNNING, X0)
    assert_refused(lambda s: moves.unknown_task(s, "s", "fx-other", "task.s", NOW), record)


def _unknown(context: str, variant: str, compensation: bool) -> SagaRecord:
    record = in_context(context, variant)
    return moves.unknown_task(record, "s", cx("s") if compensation else fx("s"), "task.s", NOW)


@pytest.mark.parametrize(("outcome", "state"), [("committed", StepState.COMMITTED),
                                                ("not-committed", StepState.FAILED)])
def test_an_unsent_step_can_be_resolved(outcome: str, state: StepState) -> None:
    saga = _unknown(RUNNING, X0, False)
    after = resolve(saga, "s", fx("s"), outcome, now_ms=NOW + 1, max_compensation_attempts=3,
                    result={"ok": 1})
    step = after.step("s")
    assert step is not None and step.state is state and step.attempts == 1


@pytest.mark.parametrize(("outcome", "state"), [("compensated", StepState.COMPENSATED),
                                                ("not-compensated", StepState.COMPENSATION_FAILED)])
def test_an_unsent_compensation_can_be_resolved(outcome: str, state: StepState) -> None:
    saga = _unknown(COMPENSATING, P0, True)
    after = resolve(saga, "s", cx("s"), outcome, now_ms=NOW + 1, max_compensation_attempts=3)
    step = after.step("s")
    assert step is not None and step.state is state


def test_an_unclaimed_step_without_the_unknown_task_code_cannot_be_resolved() -> None:
    saga = in_context(RUNNING, X0)
    reviewed = replace(saga, state=SagaState.MANUAL_REVIEW, error_code=codes.NONDETERMINISTIC,
                       reason="r")
    with pytest.raises(Exception, match="not ambiguous"):
        resolve(reviewed, "s", fx("s"), "committed", now_ms=NOW, max_compensation_attempts=3)
