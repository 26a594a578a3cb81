"""Effects: every step execution and compensation, as a view of the saga record (docs/design.md §2.3).

    admission --> executing --> committed
        |             |-------> failed      (provider proved nothing was committed)
        |             '-------> unknown     (began; outcome not known)
        '-------> failed                    (never began)

``committed`` and ``failed`` are final; ``unknown`` waits for an operator or a provider check,
which may settle it as committed or failed. The table is the legal moves. Each step carries a
mark per effect (execution, compensation): every saga move calls ``marked``, which moves
the marks towards what the step's record now implies along the table only, so an effect is
written in the same atomic write as its saga (no round trip of its own) and never moves an
effect back (a late or duplicate report, a resumed compensation).
"""

from __future__ import annotations

from collections.abc import Callable

from .._frozen import replace
from .._records import (
    EffectMark,
    EffectRecord,
    EffectState,
    SagaRecord,
    StepRecord,
    StepState,
)
from . import codes
from .kinds import kind_of

__all__ = [
    "EFFECT_TRANSITIONS",
    "FINAL_EFFECT_STATES",
    "effects_of",
    "marked",
    "marked_steps",
]

ADMISSION, EXECUTING, COMMITTED, FAILED, UNKNOWN = (
    EffectState.ADMISSION,
    EffectState.EXECUTING,
    EffectState.COMMITTED,
    EffectState.FAILED,
    EffectState.UNKNOWN,
)

EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    ADMISSION: frozenset({EXECUTING, FAILED}),
    EXECUTING: frozenset({COMMITTED, FAILED, UNKNOWN}),
    UNKNOWN: frozenset({COMMITTED, FAILED}),
    COMMITTED: frozenset(),
    FAILED: frozenset(),
}

FINAL_EFFECT_STATES = frozenset({COMMITTED, FAILED})


def _path(frm: EffectState, to: EffectState) -> tuple[EffectState, ...]:
    """The states an effect passes through from ``frm`` to ``to`` along the table: direct, or
    through one state between; executing to executing is a new attempt under the same id. No
    path (the effect is there already, or past it) moves nothing: a late or duplicate report
    never moves an effect back."""
    if frm is to:
        return (to,) if to is EXECUTING else ()
    if to in EFFECT_TRANSITIONS[frm]:
        return (to,)
    between = [m for m in EFFECT_TRANSITIONS[frm] if to in EFFECT_TRANSITIONS[m]]
    return (between[0], to) if between else ()


_PATHS = {(frm, to): _path(frm, to) for frm in EffectState for to in EffectState}

# The state of a step's execution effect, by step state (a started or retried step is executing).
_EXECUTION = {
    StepState.EXECUTING: EXECUTING,
    StepState.FAILED: FAILED,
    StepState.AMBIGUOUS: UNKNOWN,
    StepState.COMMITTED: COMMITTED,
    StepState.COMPENSATING: COMMITTED,
    StepState.COMPENSATION_FAILED: COMMITTED,
    StepState.COMPENSATED: COMMITTED,
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
            return EXECUTING, step.started_at_ms
        return (ADMISSION, step.dispatched_at_ms) if step.attempts == 0 else (EXECUTING, None)
    if step.outcome_unknown:
        return UNKNOWN, None  # compensated as declared (compensate_unknown): never known
    if step.state is StepState.COMMITTED:
        return COMMITTED, step.committed_at_ms
    state = _EXECUTION.get(step.state)
    return None if state is None else (state, None)


def _compensation_target(step: StepRecord) -> _Target | None:
    """Where a step's compensation effect stands by its record (None: not begun)."""
    if step.state is StepState.COMPENSATED:
        return COMMITTED, None
    if step.state is StepState.COMPENSATION_FAILED:
        # failed and to be retried under the same id, or given up on in review, or given a
        # fresh budget by resume (its attempts back at 0: the effect is still the one begun)
        return EXECUTING, None
    if step.compensation_attempts == 0:
        return None
    if step.state is StepState.COMPENSATING:
        if step.error_code == codes.AMBIGUOUS_COMPENSATION:
            return UNKNOWN, None
        if step.started_at_ms is not None:
            return EXECUTING, step.started_at_ms
        first = step.compensation_attempts == 1
        return (ADMISSION if first else EXECUTING), step.dispatched_at_ms
    return None


def _moved(mark: EffectMark | None, target: _Target | None, attempt: int, code: str | None,
           now_ms: int) -> EffectMark | None:
    """The mark after a move: along ``_PATHS`` towards ``target`` (a pair not listed keeps it)."""
    if target is None:
        return mark
    state, recorded_at = target
    at = now_ms if recorded_at is None else recorded_at
    if mark is None:
        mark = EffectMark(ADMISSION, at, attempt)
        if state is ADMISSION:
            return mark
    path = _PATHS.get((mark.state, state), ())
    if not path or (path == (mark.state,) and attempt == mark.attempt):
        return mark
    failed = path[-1] in (FAILED, UNKNOWN)
    return EffectMark(path[-1], max(at, mark.at_ms), attempt, code if failed else None)


def marked(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """``saga`` with each step's effect marks moved to what its record now says (docs/design.md
    §2.3), to be written in the same write as the saga record."""
    steps = marked_steps(saga.steps, now_ms)
    return saga if steps is saga.steps else replace(saga, steps=steps)


def marked_steps(steps: tuple[StepRecord, ...], now_ms: int) -> tuple[StepRecord, ...]:
    """``steps`` with their effect marks moved (``marked``); the same tuple when none moved,
    so a move that builds a new record sets them in the same copy."""
    moved = tuple(_marked_step(step, now_ms) for step in steps)
    return steps if moved == steps else moved


def _marked_step(step: StepRecord, now_ms: int) -> StepRecord:
    if kind_of(step).held:
        # a held step (a gate, a timer, a signal wait, a child) is no side effect: nothing to mark
        return step
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
    for step in marked(saga, saga.updated_at_ms).steps:
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
