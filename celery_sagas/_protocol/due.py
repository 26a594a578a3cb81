"""When a saga needs looking at again: the time its due index entry carries (docs/design.md §5).

A live saga is due at the earliest of its retries waiting for their time (an idempotent step
released for a later attempt, a compensation that failed and backs off) and of its waiting
steps' wake-up times (a timer, a signal wait's timeout: docs/design.md §3.4, §3.5). The sweep's due pass
finds exactly the sagas whose time has come, so its cost follows them alone; a saga in review
or final is never due.
"""

from __future__ import annotations

from .._records import SagaRecord, SagaState, StepRecord, StepState

__all__ = ["due_at"]

_LIVE = (SagaState.RUNNING, SagaState.COMPENSATING)


def _waiting_retry(step: StepRecord) -> int | None:
    if step.state is StepState.WAITING:
        return step.wake_at_ms
    if step.next_attempt_at_ms is None or step.started_at_ms is not None:
        return None
    if step.state in (StepState.EXECUTING, StepState.COMPENSATION_FAILED):
        return step.next_attempt_at_ms
    return None


def due_at(saga: SagaRecord) -> int | None:
    """The earliest time something of ``saga`` falls due, or None."""
    if saga.state not in _LIVE:
        return None
    times = [t for t in map(_waiting_retry, saga.steps) if t is not None]
    return min(times) if times else None
