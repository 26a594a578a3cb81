"""Operator resolution of unknown outcomes (docs/design.md §3.9), pure.

The effect id named by the operator must be the one stored for the step (the execution effect
id for an execution outcome, the compensation effect id for a compensation outcome), so a
stale review cannot settle a later attempt. Anything else raises ``SagaResolutionError`` and
changes nothing.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .._frozen import replace
from .._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState
from .._values import error_code as check_error_code
from ..errors import IllegalTransition, SagaResolutionError
from . import codes
from .moves import (
    commit_step,
    compensation_failed,
    compensation_succeeded,
    fail_step,
    one_write,
    to_manual_review,
)

__all__ = ["Resolution", "resolve"]


class Resolution(str, Enum):
    """What the operator found out."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not-committed"
    COMPENSATED = "compensated"
    NOT_COMPENSATED = "not-compensated"

    def __str__(self) -> str:
        return str(self.value)


def _outcome(value: object) -> Resolution:
    try:
        return Resolution(value)
    except ValueError:
        raise SagaResolutionError(
            f"outcome must be one of {', '.join(r.value for r in Resolution)}"
        ) from None


def _step(saga: SagaRecord, name: str) -> StepRecord:
    if saga.state.final:
        raise SagaResolutionError(f"saga {saga.saga_id!r} is {saga.state}; nothing to resolve")
    step = saga.step(name)
    if step is None:
        raise SagaResolutionError(f"saga {saga.saga_id!r} has no step {name!r}")
    return step


def _expect(step: StepRecord, effect_id: str, compensation: bool) -> None:
    stored = step.compensation_effect_id if compensation else step.effect_id
    if effect_id != stored:
        which = "compensation effect id" if compensation else "effect id"
        raise SagaResolutionError(f"step {step.name!r}: {effect_id!r} is not its {which}")


def _unsent(step: StepRecord, state: StepState) -> bool:
    """A step whose task no worker knew (``unknown_task``): never claimed, so never begun."""
    return (step.state is state and step.error_code == codes.UNKNOWN_TASK
            and step.started_at_ms is None)


def _with_step(saga: SagaRecord, step: StepRecord) -> SagaRecord:
    return replace(saga, steps=tuple(step if s.name == step.name else s for s in saga.steps))


def _forward(saga: SagaRecord, step: StepRecord, outcome: Resolution, result: Any,
             code: str | None, now_ms: int) -> SagaRecord:
    if _unsent(step, StepState.EXECUTING):
        # The operator settles it as if an attempt had run: one attempt, claimed now.
        step = replace(step, attempts=step.attempts + 1, started_at_ms=now_ms)
        saga = _with_step(saga, step)
    elif step.state is not StepState.AMBIGUOUS:
        raise SagaResolutionError(f"step {step.name!r} is {step.state}, not ambiguous")
    ref = AttemptRef.execution(step)
    if outcome is Resolution.COMMITTED:
        return commit_step(saga, ref, result, now_ms)
    failure = check_error_code(code) if code is not None else codes.NOT_COMMITTED
    return fail_step(saga, ref, failure, now_ms)


def _backward(saga: SagaRecord, step: StepRecord, outcome: Resolution, max_compensation_attempts: int,
              now_ms: int) -> SagaRecord:
    unknown = step.state is StepState.COMPENSATING and step.error_code == codes.AMBIGUOUS_COMPENSATION
    exhausted = step.state is StepState.COMPENSATION_FAILED
    unsent = _unsent(step, StepState.COMPENSATING)
    if not unknown and not unsent and not (exhausted and outcome is Resolution.COMPENSATED):
        raise SagaResolutionError(f"step {step.name!r} is {step.state}: no compensation to settle")
    attempt = step.compensation_attempts
    ref = AttemptRef.compensation(step)
    if exhausted or unsent:
        step = replace(step, state=StepState.COMPENSATING, started_at_ms=now_ms)
        saga = _with_step(saga, step)
    if outcome is Resolution.COMPENSATED:
        return compensation_succeeded(saga, ref, now_ms)
    after = compensation_failed(saga, ref, now_ms, now_ms)
    if attempt >= max_compensation_attempts and after.state is not SagaState.MANUAL_REVIEW:
        reason = f"compensation of step {step.name!r} failed {attempt} times"
        return one_write(saga, to_manual_review(after, codes.COMPENSATION_EXHAUSTED, reason, now_ms))
    return after


def resolve(
    saga: SagaRecord,
    step_name: str,
    effect_id: str,
    outcome: object,
    *,
    now_ms: int,
    max_compensation_attempts: int,
    result: Any = None,
    error_code: str | None = None,
) -> SagaRecord:
    """Settle an unknown outcome of ``step_name`` as the operator found it."""
    chosen = _outcome(outcome)
    step = _step(saga, step_name)
    compensation = chosen in (Resolution.COMPENSATED, Resolution.NOT_COMPENSATED)
    _expect(step, effect_id, compensation)
    try:
        if compensation:
            resolved = _backward(saga, step, chosen, max_compensation_attempts, now_ms)
        else:
            resolved = _forward(saga, step, chosen, result, error_code, now_ms)
    except IllegalTransition as exc:
        raise SagaResolutionError(str(exc)) from exc
    return resolved
