"""The compensation planner and retry-policy checks (docs/design.md §2.2, "Compensation").

Committed steps are undone one at a time, in reverse order of commit. A step whose retry is
not yet due stops the walk for now (the beat-driven sweep comes back when it is due); a step
whose attempts reached the maximum sends the saga to manual review.
"""

from __future__ import annotations

from .._records import SagaRecord, StepRecord, StepState
from . import codes
from .decisions import BeginCompensation, Decision, FinishCompensation, Review, Wait
from .kinds import HELD_STATES

__all__ = [
    "MAX_BACKOFF_MS",
    "check_backoff",
    "commit_order",
    "default_backoff_ms",
    "full_jitter_ms",
    "plan_compensation",
    "rollback_reason",
]

# Past a year "now + delay" stops meaning anything (and near 2**53 it leaves the safe range).
MAX_BACKOFF_MS = 366 * 24 * 3600 * 1000


def default_backoff_ms(attempt: int) -> int:
    """The ceiling of the default backoff (steps and compensators): min(60 s, 100 ms *
    2**(attempt - 1)); the engine waits a delay drawn from 0 to it (``full_jitter_ms``)."""
    return int(min(60_000, 100 * 2 ** min(attempt - 1, 20)))


def full_jitter_ms(ceiling_ms: int, draw: float) -> int:
    """Full jitter: a delay from 0 to ``ceiling_ms``, ``draw`` (from 0 to 1, drawn by the
    caller: no randomness here) of the way up."""
    fraction = min(max(draw, 0.0), 1.0) if draw == draw else 0.0  # NaN counts as 0
    return min(ceiling_ms, int(ceiling_ms * fraction))


def check_backoff(delay: object) -> int | None:
    """A backoff value as an integer of ms in 0..MAX_BACKOFF_MS, or None when it is invalid."""
    if isinstance(delay, bool) or not isinstance(delay, int):
        return None
    if not 0 <= delay <= MAX_BACKOFF_MS:
        return None
    return delay


def commit_order(saga: SagaRecord) -> list[StepRecord]:
    """Steps newest-committed first (list position breaks ties)."""
    indexed = list(enumerate(saga.steps))
    indexed.sort(key=lambda pair: (pair[1].committed_at_ms or 0, pair[0]), reverse=True)
    return [step for _, step in indexed]


_TO_UNDO = (StepState.COMMITTED, StepState.COMPENSATION_FAILED)
# A step still going forward (a child saga being cancelled, a gate being abandoned included).
_FORWARD_IN_FLIGHT = (StepState.EXECUTING, *HELD_STATES)


def rollback_reason(saga: SagaRecord) -> tuple[str | None, str]:
    """(step, code) that turned the saga back: the latest step that failed with the saga's
    error code, or whose unknown outcome is being compensated (its execution effect keeps the
    code); no step when ``run`` refused or the saga was cancelled."""
    code = saga.error_code or codes.CANCELLED
    for step in reversed(saga.steps):
        if step.state is StepState.FAILED and step.error_code == code:
            return step.name, code
        if step.outcome_unknown and step.execution is not None \
                and step.execution.error_code == code:
            return step.name, code
    return None, code


def plan_compensation(saga: SagaRecord, now_ms: int, max_compensation_attempts: int, *,
                      parallel: bool = False) -> Decision:
    """Next compensation action for a saga with nothing in flight (``parallel``: with
    compensators in flight, whose siblings begin without waiting for them)."""
    if parallel:
        return _plan_parallel(saga, now_ms, max_compensation_attempts)
    for step in saga.steps:
        if step.state is StepState.AMBIGUOUS or (
            step.state is StepState.COMPENSATING and step.error_code == codes.AMBIGUOUS_COMPENSATION
        ):
            return Review(codes.AMBIGUOUS_STEP, f"step {step.name!r} is ambiguous")
        if step.state in (StepState.EXECUTING, StepState.COMPENSATING):
            return Wait()
    for step in commit_order(saga):
        if step.state not in _TO_UNDO or step.compensator is None:
            continue
        # The budget is checked first: once the last attempt failed there is nothing to wait for.
        if step.compensation_attempts >= max_compensation_attempts:
            return Review(
                codes.COMPENSATION_EXHAUSTED,
                f"compensation of step {step.name!r} failed {step.compensation_attempts} times",
            )
        if step.next_attempt_at_ms is not None and now_ms < step.next_attempt_at_ms:
            return Wait(step.next_attempt_at_ms)
        return BeginCompensation(step)
    return FinishCompensation()


def _plan_parallel(saga: SagaRecord, now_ms: int, max_attempts: int) -> Decision:
    """``compensation="parallel"``: begin every committed step that is due, whatever else is
    compensating; wait for the ones in flight; review an exhausted one once the rest settled."""
    for step in saga.steps:
        if step.state is StepState.AMBIGUOUS or (
            step.state is StepState.COMPENSATING and step.error_code == codes.AMBIGUOUS_COMPENSATION
        ):
            return Review(codes.AMBIGUOUS_STEP, f"step {step.name!r} is ambiguous")
        if step.state in _FORWARD_IN_FLIGHT:
            return Wait()  # forward work still in flight is waited for, as in reverse order
    exhausted, due = None, []
    for step in commit_order(saga):
        if step.state not in _TO_UNDO or step.compensator is None:
            continue
        if step.compensation_attempts >= max_attempts:
            exhausted = exhausted or step
        elif step.next_attempt_at_ms is not None and now_ms < step.next_attempt_at_ms:
            due.append(step.next_attempt_at_ms)
        else:
            return BeginCompensation(step)
    if any(step.state is StepState.COMPENSATING for step in saga.steps):
        return Wait(min(due) if due else None)
    if exhausted is not None:
        return Review(codes.COMPENSATION_EXHAUSTED,
                      f"compensation of step {exhausted.name!r} failed "
                      f"{exhausted.compensation_attempts} times")
    return Wait(min(due)) if due else FinishCompensation()
