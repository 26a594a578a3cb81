"""Effects: every step execution and compensation, as a view of the saga record (docs/design.md §2.3).

    admission --> executing --> committed
        |             |-------> failed      (provider proved nothing was committed)
        |             '-------> unknown     (began; outcome not known)
        '-------> failed                    (never began)

``committed`` and ``failed`` are final; ``unknown`` waits for an operator or a provider check,
which may settle it as committed or failed. The table is the legal moves. Each step carries a
mark per effect (execution, compensation): every saga move calls ``journaled``, which moves
the marks towards what the step's record now implies along the table only, so the journal is
written in the same atomic write as its saga (no round trip of its own) and never moves an
effect back (a late or duplicate report, a resumed compensation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .._records import (
    APPROVAL_TASK,
    EffectMark,
    EffectRecord,
    EffectState,
    SagaRecord,
    StepRecord,
    StepState,
)
from .._values import error_code as check_error_code
from ..errors import IllegalTransition
from . import codes

__all__ = [
    "EFFECT_TRANSITIONS",
    "FINAL_EFFECT_STATES",
    "effects_of",
    "journaled",
    "transition_effect",
]

_A, _X, _C, _F, _U = (
    EffectState.ADMISSION,
    EffectState.EXECUTING,
    EffectState.COMMITTED,
    EffectState.FAILED,
    EffectState.UNKNOWN,
)

EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    _A: frozenset({_X, _F}),
    _X: frozenset({_C, _F, _U}),
    _U: frozenset({_C, _F}),
    _C: frozenset(),
    _F: frozenset(),
}

FINAL_EFFECT_STATES = frozenset({_C, _F})


def transition_effect(
    record: EffectRecord, to: EffectState, now_ms: int, error_code: str | None = None
) -> EffectRecord:
    """Return the record moved to ``to`` (version + 1); raise IllegalTransition otherwise."""
    if to not in EFFECT_TRANSITIONS[record.state]:
        raise IllegalTransition(state=str(record.state), event=str(to))
    if error_code is not None:
        check_error_code(error_code)
    return replace(
        record,
        state=to,
        version=record.version + 1,
        updated_at_ms=max(now_ms, record.updated_at_ms),
        error_code=error_code if error_code is not None else record.error_code,
    )


# The writes that bring an effect from its state to the one its step now implies (executing to
# executing is a new attempt under the same effect id). A pair not listed moves nothing: the
# effect is there already, or past it (a late or duplicate report never moves it back).
_PATHS: dict[tuple[EffectState, EffectState], tuple[EffectState, ...]] = {
    (_A, _X): (_X,), (_A, _C): (_X, _C), (_A, _F): (_F,), (_A, _U): (_X, _U),
    (_X, _X): (_X,), (_X, _C): (_C,), (_X, _F): (_F,), (_X, _U): (_U,),
    (_U, _C): (_C,), (_U, _F): (_F,),
}

# The state of a step's execution effect, by step state (a started or retried step is executing).
_EXECUTION = {
    StepState.EXECUTING: _X,
    StepState.FAILED: _F,
    StepState.AMBIGUOUS: _U,
    StepState.COMMITTED: _C,
    StepState.COMPENSATING: _C,
    StepState.COMPENSATION_FAILED: _C,
    StepState.COMPENSATED: _C,
}

Capability = Callable[[SagaRecord, StepRecord, bool], str]


# What a step's record says of one of its effects: the state, and when the step's own timestamps
# say it got there (None: not recorded). The time only dates a mark made for a record written
# before marks existed; a mark that moves is dated by the move.
_Target = tuple[EffectState, int | None]


def _execution_target(step: StepRecord) -> _Target | None:
    """Where a step's execution effect stands by its record (None: nothing yet)."""
    if step.state is StepState.EXECUTING:
        if step.started_at_ms is not None:
            return _X, step.started_at_ms
        return (_A, step.dispatched_at_ms) if step.attempts == 0 else (_X, None)
    if step.state is StepState.COMMITTED:
        return _C, step.committed_at_ms
    state = _EXECUTION.get(step.state)
    return None if state is None else (state, None)


def _compensation_target(step: StepRecord) -> _Target | None:
    """Where a step's compensation effect stands by its record (None: not begun)."""
    if step.state is StepState.COMPENSATED:
        return _C, None
    if step.state is StepState.COMPENSATION_FAILED:
        # failed and to be retried under the same id, or given up on in review, or given a
        # fresh budget by resume (its attempts back at 0: the effect is still the one begun)
        return _X, None
    if step.compensation_attempts == 0:
        return None
    if step.state is StepState.COMPENSATING:
        if step.error_code == codes.AMBIGUOUS_COMPENSATION:
            return _U, None
        if step.started_at_ms is not None:
            return _X, step.started_at_ms
        first = step.compensation_attempts == 1
        return (_A if first else _X), step.dispatched_at_ms
    return None


def _moved(mark: EffectMark | None, target: _Target | None, attempt: int, code: str | None,
           now_ms: int) -> EffectMark | None:
    """The mark after a move: along ``_PATHS`` towards ``target`` (a pair not listed keeps it)."""
    if target is None:
        return mark
    state, recorded_at = target
    at = now_ms if recorded_at is None else recorded_at
    if mark is None:
        mark = EffectMark(_A, at, attempt)
        if state is _A:
            return mark
    path = _PATHS.get((mark.state, state), ())
    if not path or (path == (mark.state,) and attempt == mark.attempt):
        return mark
    failed = path[-1] in (_F, _U)
    return EffectMark(path[-1], max(at, mark.at_ms), attempt, code if failed else None)


def journaled(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """``saga`` with each step's effect marks moved to what its record now says (docs/design.md
    §2.3): the effect journal, written in the same write as the saga record."""
    steps = tuple(_journaled(step, now_ms) for step in saga.steps)
    return saga if steps == saga.steps else replace(saga, steps=steps)


def _journaled(step: StepRecord, now_ms: int) -> StepRecord:
    if step.task == APPROVAL_TASK:
        return step  # an approval gate is no side effect: its approval record is its journal
    execution = _moved(step.execution, _execution_target(step), step.attempts, step.error_code,
                       now_ms)
    compensation = _moved(step.compensation, _compensation_target(step),
                          step.compensation_attempts, step.error_code, now_ms)
    if execution is step.execution and compensation is step.compensation:
        return step
    return replace(step, execution=execution, compensation=compensation)


def effects_of(saga: SagaRecord, capability: Capability) -> tuple[EffectRecord, ...]:
    """Every effect of the saga's steps, as their marks say (approval gates have none)."""
    found: list[EffectRecord] = []
    for step in journaled(saga, saga.updated_at_ms).steps:
        for compensation, mark in ((False, step.execution), (True, step.compensation)):
            if mark is not None:
                found.append(_effect(saga, step, mark, compensation, capability))
    return tuple(found)


def _effect(saga: SagaRecord, step: StepRecord, mark: EffectMark, compensation: bool,
            capability: Capability) -> EffectRecord:
    return EffectRecord(
        effect_id=step.compensation_effect_id if compensation else step.effect_id,
        capability=capability(saga, step, compensation),
        state=mark.state,
        created_at_ms=min(saga.created_at_ms, mark.at_ms),
        updated_at_ms=mark.at_ms,
        version=saga.version,
        error_code=mark.error_code,
        saga_id=saga.saga_id,
        step=step.name,
        stage="compensation" if compensation else "execution",
    )
