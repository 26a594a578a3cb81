"""Record builders shared by the protocol tests: one step per state variant, sagas around them.

Every step built for name ``n`` has effect id ``fx-n``, compensation effect id ``cx-n``, task
``task.n`` and compensator ``undo.n``, so tests can name the ids without looking them up.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.decisions import (
    Abandon,
    Append,
    BeginCompensation,
    Complete,
    Decision,
    FinishCompensation,
    Redispatch,
    Review,
    StartCompensation,
    Vanished,
    Wait,
)
from celery_sagas._protocol.effects import marked
from celery_sagas._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState
from celery_sagas.errors import IllegalTransition

T0 = 1_700_000_000_000
NOW = T0 + 1_000
CREATED = T0
UPDATED = T0 + 100

S = StepState

# Step variants: a short name for every step state the protocol distinguishes.
X0 = "executing-unclaimed"
X1 = "executing-claimed"
XR = "executing-released"
AW = "awaiting-approval"
CM = "committed"
FL = "failed"
AM = "ambiguous"
P0 = "compensating-unclaimed"
P1 = "compensating-claimed"
PA = "compensating-ambiguous"
CF = "compensation-failed"
CD = "compensated"

VARIANTS = (X0, X1, XR, AW, CM, FL, AM, P0, P1, PA, CF, CD)
AMBIGUOUS_VARIANTS = frozenset({AM, PA})


def fx(name: str) -> str:
    """The execution effect id of the step named ``name``."""
    return f"fx-{name}"


def cx(name: str) -> str:
    """The compensation effect id of the step named ``name``."""
    return f"cx-{name}"


def intent(name: str = "s", **changes: Any) -> StepRecord:
    """A freshly recorded step intent: executing, attempts 0, dispatched at T0."""
    base = StepRecord(
        name=name,
        task=f"task.{name}",
        effect_id=fx(name),
        compensation_effect_id=cx(name),
        state=S.EXECUTING,
        args=(1, "a"),
        kwargs={"key": name},
        compensator=f"undo.{name}",
        dispatched_at_ms=T0,
    )
    return replace(base, **changes)


def _committed(name: str, at: int) -> dict[str, Any]:
    return {
        "state": S.COMMITTED,
        "attempts": 1,
        "started_at_ms": at - 10,
        "claimed_by": "worker-1",
        "result": {"id": name},
        "committed_at_ms": at,
    }


def step(variant: str, name: str = "s", *, committed_at: int = T0 + 20, **changes: Any) -> StepRecord:
    """A step named ``name`` in the given variant, with fields as the protocol would leave them."""
    done = _committed(name, committed_at)
    started = {"attempts": 1, "started_at_ms": T0 + 10, "claimed_by": "worker-1"}
    unclaimed = {"started_at_ms": None, "claimed_by": None}
    comp = {**done, **unclaimed, "state": S.COMPENSATING, "compensation_attempts": 1,
            "dispatched_at_ms": T0 + 30}
    fields: dict[str, dict[str, Any]] = {
        X0: {},
        X1: started,
        XR: {"attempts": 1, "next_attempt_at_ms": T0 + 5_000, "error_code": codes.TIME_LIMIT,
             "dispatched_at_ms": None},
        AW: {"state": S.AWAITING_APPROVAL, "approval_id": f"ap-{name}"},
        CM: done,
        FL: {**started, "state": S.FAILED, "error_code": "card_declined"},
        AM: {**started, "state": S.AMBIGUOUS, "error_code": codes.WORKER_LOST},
        P0: comp,
        P1: {**comp, "started_at_ms": T0 + 40, "claimed_by": "worker-2"},
        PA: {**comp, "started_at_ms": T0 + 40, "claimed_by": "worker-2",
             "error_code": codes.AMBIGUOUS_COMPENSATION},
        CF: {**done, **unclaimed, "state": S.COMPENSATION_FAILED, "compensation_attempts": 1,
             "next_attempt_at_ms": T0 + 5_000, "error_code": codes.COMPENSATION_FAILED},
        CD: {**done, "state": S.COMPENSATED, "compensation_attempts": 1, "started_at_ms": T0 + 40},
    }
    return intent(name, **{**fields[variant], **changes})


def saga(
    *steps: StepRecord,
    state: SagaState = SagaState.RUNNING,
    rolling_back: bool | None = None,
    error_code: str | None = None,
    reason: str | None = None,
    version: int = 5,
) -> SagaRecord:
    """A saga holding ``steps``, their effect marks as a write would leave them; rolling back by
    default exactly when compensating."""
    if rolling_back is None:
        rolling_back = state in (SagaState.COMPENSATING, SagaState.COMPENSATED)
    if state is SagaState.MANUAL_REVIEW and error_code is None:
        error_code, reason = codes.NONDETERMINISTIC, "review"
    return marked(SagaRecord(
        saga_id="order-42",
        definition="place-order",
        state=state,
        input={"sku": "A-1", "qty": 2},
        created_at_ms=CREATED,
        updated_at_ms=UPDATED,
        steps=tuple(steps),
        version=version,
        error_code=error_code,
        reason=reason,
        rolling_back=rolling_back,
    ), UPDATED)


# Saga contexts: a saga state plus the direction it was going.
RUNNING = "running"
COMPENSATING = "compensating"
REVIEW_FORWARD = "review-forward"
REVIEW_ROLLBACK = "review-rollback"
COMPLETED = "completed"
COMPENSATED = "compensated"

CONTEXTS: dict[str, tuple[SagaState, bool]] = {
    RUNNING: (SagaState.RUNNING, False),
    COMPENSATING: (SagaState.COMPENSATING, True),
    REVIEW_FORWARD: (SagaState.MANUAL_REVIEW, False),
    REVIEW_ROLLBACK: (SagaState.MANUAL_REVIEW, True),
    COMPLETED: (SagaState.COMPLETED, False),
    COMPENSATED: (SagaState.COMPENSATED, True),
}
OPEN = frozenset({RUNNING, COMPENSATING, REVIEW_FORWARD, REVIEW_ROLLBACK})
LIVE = frozenset({RUNNING, COMPENSATING})
REVIEW = frozenset({REVIEW_FORWARD, REVIEW_ROLLBACK})


def review_code(variant: str) -> tuple[str, str]:
    """The review code a saga in review around this step variant carries."""
    if variant == AM:
        return codes.AMBIGUOUS_STEP, "step 's' is ambiguous"
    if variant == PA:
        return codes.AMBIGUOUS_COMPENSATION, "compensation of step 's' is ambiguous"
    return codes.NONDETERMINISTIC, "run() diverged"


def in_context(context: str, variant: str) -> SagaRecord:
    """A one-step saga in ``context`` whose step is in ``variant``."""
    state, rolling_back = CONTEXTS[context]
    code, why = review_code(variant) if state is SagaState.MANUAL_REVIEW else (None, None)
    return saga(step(variant), state=state, rolling_back=rolling_back, error_code=code, reason=why)


def frozen_copy(record: Any) -> Any:
    """A deep copy to compare a record with after a refused transition."""
    return copy.deepcopy(record)


def assert_refused(apply: Callable[[SagaRecord], object], record: SagaRecord) -> IllegalTransition:
    """``apply(record)`` raises IllegalTransition and leaves ``record`` as it was."""
    before = frozen_copy(record)
    with pytest.raises(IllegalTransition) as caught:
        apply(record)
    assert record == before
    return caught.value


def apply_decision(record: SagaRecord, decision: Decision, now: int) -> SagaRecord:
    """Carry out a decision the way the engine does (without I/O); Wait returns the record."""
    if isinstance(decision, Wait):
        return record
    if isinstance(decision, Append):
        return moves.append_steps(record, decision.steps, now)
    if isinstance(decision, Redispatch):
        return moves.mark_redispatched(record, decision.step.name, now)
    if isinstance(decision, BeginCompensation):
        return moves.begin_compensation(record, decision.step.name, now)
    if isinstance(decision, Abandon):
        return moves.abandon_step(record, decision.step.name, decision.step.effect_id, now)
    if isinstance(decision, Complete):
        return moves.complete(record, now)
    if isinstance(decision, FinishCompensation):
        return moves.finish_compensation(record, now)
    if isinstance(decision, StartCompensation):
        return moves.start_compensation(record, decision.error_code, decision.reason, now)
    if isinstance(decision, Review):
        return moves.to_manual_review(record, decision.error_code, decision.reason, now)
    assert isinstance(decision, Vanished)
    return _vanished(record, decision, now)


def _vanished(record: SagaRecord, decision: Vanished, now: int) -> SagaRecord:
    found = decision.step
    if decision.compensation:
        effect, attempt = found.compensation_effect_id, found.compensation_attempts
        if decision.retry:
            return moves.compensation_failed(record, AttemptRef(found.name, effect, attempt), now, now)
        return moves.compensation_ambiguous(record, AttemptRef(found.name, effect, attempt), now)
    if decision.retry:
        return moves.release_step(record, AttemptRef(found.name, found.effect_id, found.attempts), now,
                                  decision.error_code, now)
    return moves.step_ambiguous(record, AttemptRef(found.name, found.effect_id, found.attempts),
                                decision.error_code, now)


def names(steps: Iterable[StepRecord]) -> list[str]:
    """The names of ``steps`` in order."""
    return [s.name for s in steps]
