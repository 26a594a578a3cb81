"""Choose the single next action for a saga (pure).

``decide`` reads a saga record, the outcome of replaying its ``run`` function, the time and
the policy, and returns exactly one decision. The engine carries it out with one
compare-and-set (and a dispatch after it succeeds), then asks again; a lost race means reload
and decide afresh.

In-flight work is judged the same way forward and backward (docs/design.md §3.3): not yet claimed by its
task means in flight (re-dispatched under the same effect id once stale); claimed and within
its time limit plus grace means running; claimed and silent past that, or claimed by a process
known to be gone (``dead_effects``), means the attempt vanished.
"""

from __future__ import annotations

from collections.abc import Callable

from .._records import SagaRecord, SagaState, StepRecord, StepState
from . import codes
from .compensation import plan_compensation
from .decisions import (
    Abandon,
    Append,
    Complete,
    Decision,
    Redispatch,
    Review,
    SagaPolicy,
    Vanished,
    Wait,
)
from .kinds import HELD_STATES, kind_of
from .moves import unresolved_ambiguity
from .replay import Crashed, Diverged, Outcome, Refused, Returned, Suspended

__all__ = ["decide", "judge_in_flight"]


def _vanished(step: StepRecord, policy: SagaPolicy, rolling_back: bool, code: str) -> Vanished:
    if step.state is StepState.COMPENSATING:
        retry = step.compensator in policy.compensators_idempotent
        return Vanished(step, compensation=True, retry=retry, error_code=code)
    options = policy.step(step.task)
    retry = options.idempotent and step.attempts < options.attempts_per_effect and not rolling_back
    return Vanished(step, compensation=False, retry=retry, error_code=code,
                    compensate=options.compensate_unknown)


def judge_in_flight(
    step: StepRecord,
    now_ms: int,
    policy: SagaPolicy,
    dead_effects: frozenset[str] = frozenset(),
    *,
    rolling_back: bool = False,
) -> Decision:
    """Judge one executing or compensating step: wait, re-dispatch, or vanished."""
    compensation = step.state is StepState.COMPENSATING
    if step.started_at_ms is None:
        due = step.next_attempt_at_ms
        if due is not None and now_ms < due:
            return Wait(due)
        sent = step.dispatched_at_ms
        if sent is not None and now_ms < sent + policy.stale_ms:
            return Wait(sent + policy.stale_ms)
        return Redispatch(step, compensation)
    effect = step.compensation_effect_id if compensation else step.effect_id
    if effect in dead_effects:
        return _vanished(step, policy, rolling_back, codes.WORKER_LOST)
    own = policy.compensator_time_limits.get(step.compensator or "") if compensation else None
    limit = (own if compensation else step.time_limit_ms) or policy.default_time_limit_ms
    deadline = step.started_at_ms + limit + policy.grace_ms
    if now_ms >= deadline:
        return _vanished(step, policy, rolling_back, codes.TIME_LIMIT)
    return Wait(deadline)


def _earliest(waits: list[Wait]) -> Wait:
    times = [w.until_ms for w in waits if w.until_ms is not None]
    return Wait(min(times) if times else None)


def _in_flight(
    saga: SagaRecord, now_ms: int, policy: SagaPolicy, dead: frozenset[str]
) -> Decision | None:
    """The first in-flight step needing action, or the earliest wait, or None if none."""
    waits: list[Wait] = []
    for step in saga.steps:
        if step.state in HELD_STATES:
            # a held step wakes as its kind says (docs/design.md §3.11); a child saga runs on
            # its own and settles its step (cancelled first when rolling back, §3.7)
            kind = kind_of(step)
            if saga.rolling_back and kind.abandoned_on_rollback:
                return Abandon(step)
            woken = kind.judge(saga, step, now_ms) if kind.judge is not None else None
            if woken is None:
                continue
            if not isinstance(woken, Wait):
                return woken
            waits.append(woken)
            continue
        live = step.state is StepState.EXECUTING or (
            step.state is StepState.COMPENSATING and step.error_code != codes.AMBIGUOUS_COMPENSATION
        )
        if not live:
            continue
        if saga.rolling_back and step.state is StepState.EXECUTING and step.started_at_ms is None:
            if step.attempts == 0:
                return Abandon(step)
            options = policy.step(step.task)
            if options.retry_on and not options.idempotent:
                # Released by retry_on only (a step that is not idempotent is never retried
                # after an unknown outcome): its last attempt provably committed nothing.
                return Abandon(step, nothing_committed=True)
            # An idempotent step released for a retry: its last attempt may have committed,
            # and no retry starts while rolling back, so its outcome stays unknown.
            return Vanished(step, compensation=False, retry=False,
                            error_code=step.error_code or codes.STEP_ERROR,
                            compensate=policy.step(step.task).compensate_unknown)
        verdict = judge_in_flight(step, now_ms, policy, dead, rolling_back=saga.rolling_back)
        if not isinstance(verdict, Wait):
            return verdict
        waits.append(verdict)
    return _earliest(waits) if waits else None


def decide(
    saga: SagaRecord,
    replay: Callable[[], Outcome] | None,
    now_ms: int,
    policy: SagaPolicy,
    dead_effects: frozenset[str] = frozenset(),
) -> Decision:
    """The single next action for ``saga``; ``replay`` runs the definition when needed."""
    if saga.state not in (SagaState.RUNNING, SagaState.COMPENSATING):
        return Wait()
    flight = _in_flight(saga, now_ms, policy, dead_effects)
    if flight is not None and not isinstance(flight, Wait):
        return flight
    if saga.state is SagaState.COMPENSATING:
        if not policy.parallel_compensation:
            return flight or plan_compensation(saga, now_ms, policy.max_compensation_attempts)
        planned = plan_compensation(saga, now_ms, policy.max_compensation_attempts, parallel=True)
        if isinstance(planned, Wait) and flight is not None:
            return _earliest([planned, flight])
        return planned
    if unresolved_ambiguity(saga) is not None:
        return flight or Wait()
    if replay is None or _held(saga):
        # a waiting step stops every replay there: nothing new to record until it commits, so
        # a sleeping saga costs the sweep no replay (docs/design.md §3.4)
        return flight or Wait()
    return _forward(saga, replay(), flight)


def _held(saga: SagaRecord) -> bool:
    return any(step.state is StepState.WAITING for step in saga.steps)


def _forward(saga: SagaRecord, outcome: Outcome, flight: Decision | None) -> Decision:
    if isinstance(outcome, Diverged):
        return Review(codes.NONDETERMINISTIC, outcome.reason)
    if isinstance(outcome, Crashed):
        return outcome
    if isinstance(outcome, Refused):
        return outcome
    if isinstance(outcome, Returned):
        if flight is not None:
            return flight
        return Complete(outcome.patches, outcome.value)
    assert isinstance(outcome, Suspended)
    if outcome.new_steps:
        return Append(outcome.new_steps, outcome.patches)
    return flight or Wait()
