"""Effects: every step execution and compensation, as a view of the saga record (docs/design.md §2.3).

    admission --> executing --> committed
        |             |-------> failed      (provider proved nothing was committed)
        |             '-------> unknown     (began; outcome not known)
        '-------> failed                    (never began)

``committed`` and ``failed`` are final; ``unknown`` waits for an operator or a provider check,
which may settle it as committed or failed. The table is the legal moves; ``effects_of``
derives each step's two effects from the saga record, so an effect's state is written in the
same atomic write as its saga (no journal round trip), and every move of the saga moves its
effects along the table only (the property tests check it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .._records import APPROVAL_TASK, EffectRecord, EffectState, SagaRecord, StepRecord, StepState
from .._values import error_code as check_error_code
from ..errors import IllegalTransition
from . import codes

__all__ = ["EFFECT_TRANSITIONS", "FINAL_EFFECT_STATES", "effects_of", "transition_effect"]

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


# The state of a step's execution effect, by step state (a started or retried step is executing).
_EXECUTION = {
    StepState.FAILED: _F,
    StepState.AMBIGUOUS: _U,
    StepState.COMMITTED: _C,
    StepState.COMPENSATING: _C,
    StepState.COMPENSATION_FAILED: _C,
    StepState.COMPENSATED: _C,
}

Capability = Callable[[SagaRecord, StepRecord, bool], str]


def _execution(step: StepRecord) -> tuple[EffectState, int | None]:
    """The execution effect's state and when it last moved (None: as its saga)."""
    if step.state is StepState.EXECUTING:
        if step.started_at_ms is not None:
            return _X, step.started_at_ms
        return (_A, step.dispatched_at_ms) if step.attempts == 0 else (_X, None)
    if step.state is StepState.COMMITTED:
        return _C, step.committed_at_ms
    return _EXECUTION[step.state], None


def _compensation(step: StepRecord) -> tuple[EffectState, int | None] | None:
    """The compensation effect's state (None while it has not begun)."""
    if step.compensation_attempts == 0:
        return None
    if step.state is StepState.COMPENSATED:
        return _C, None
    if step.state is StepState.COMPENSATING:
        if step.error_code == codes.AMBIGUOUS_COMPENSATION:
            return _U, None
        if step.started_at_ms is not None:
            return _X, step.started_at_ms
        first = step.compensation_attempts == 1
        return (_A, step.dispatched_at_ms) if first else (_X, step.dispatched_at_ms)
    return _X, None  # failed, to be retried (or given up on: the saga is in review)


def effects_of(saga: SagaRecord, capability: Capability) -> tuple[EffectRecord, ...]:
    """Every effect of the saga's steps (approval gates are no side effect and have none)."""
    found: list[EffectRecord] = []
    for step in saga.steps:
        if step.task == APPROVAL_TASK:
            continue
        found.append(_effect(saga, step, *_execution(step), False, capability))
        backward = _compensation(step)
        if backward is not None:
            found.append(_effect(saga, step, *backward, True, capability))
    return tuple(found)


def _effect(saga: SagaRecord, step: StepRecord, state: EffectState, moved_at: int | None,
            compensation: bool, capability: Capability) -> EffectRecord:
    at = moved_at if moved_at is not None else saga.updated_at_ms
    failed = state in (_F, _U)
    return EffectRecord(
        effect_id=step.compensation_effect_id if compensation else step.effect_id,
        capability=capability(saga, step, compensation),
        state=state,
        created_at_ms=min(saga.created_at_ms, at),
        updated_at_ms=at,
        version=saga.version,
        error_code=step.error_code if failed else None,
        saga_id=saga.saga_id,
        step=step.name,
        stage="compensation" if compensation else "execution",
    )
