"""Saga and step transitions (docs/design.md §2.1, §2.2): pure functions of records.

Theory of operation. A saga record is rewritten whole by each transition, which the engine
stores with one compare-and-set. A transition checks the saga state, the step state and the
effect id it expects (so a late or duplicate message cannot move a newer attempt), then
returns a new record with ``version + 1``; an illegal move raises ``IllegalTransition`` and
leaves the input untouched (records are frozen).

Step moves, forward:

    (intent) --> executing --claim--> executing* --commit--> committed
                     |                     |------fail----> failed
                     |                     |---ambiguous--> ambiguous --late commit/fail-->
                     |                     '----release---> executing (idempotent retry)
                     '----abandon (rolling back, never claimed)--> failed
    (intent) --> waiting --wake (timer due, signal came, wait timed out)--> committed
                     '----abandon (rolling back)--> failed

Compensation, for a committed step:

    committed | compensation-failed --begin--> compensating --claim--> compensating*
    compensating* --succeeded--> compensated
    compensating* --failed-----> compensation-failed (next_attempt_at stored)
    compensating* --ambiguous--> compensating, saga manual-review

(* = started: ``started_at_ms`` set by the claim.) Moves about one attempt take an
``AttemptRef`` (step, effect id, attempt number). After every step move, ``derive_state`` derives
the saga state: ambiguity with nothing else in flight means manual review; a known failure
turns a running saga into a compensating one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._frozen import replace
from .._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState
from .._values import error_code as check_error_code
from ..errors import IllegalTransition
from . import codes
from .effects import marked_steps
from .kinds import APPROVAL, HELD_STATES, child_id_of, kind_of

__all__ = [
    "abandon_step",
    "append_steps",
    "begin_compensation",
    "cancel",
    "child_review_reason",
    "child_settled",
    "claim_compensation",
    "claim_step",
    "commit_step",
    "compensation_ambiguous",
    "compensation_failed",
    "compensation_succeeded",
    "complete",
    "direction",
    "fail_gate",
    "fail_step",
    "finish_compensation",
    "mark_redispatched",
    "one_write",
    "pass_gate",
    "raised_in_run",
    "refuse_child",
    "release_step",
    "reopen",
    "resume",
    "start_compensation",
    "step_ambiguous",
    "to_manual_review",
    "unknown_reason",
    "unknown_task",
    "unresolved_ambiguity",
    "wake_step",
    "with_exception",
    "withdraw_claim",
]

_LIVE = (SagaState.RUNNING, SagaState.COMPENSATING)
# The states a step is recorded in; the last two hold the saga without a task.
_INTENT_STATES = (StepState.EXECUTING, *HELD_STATES)
_ANY_OPEN = (SagaState.RUNNING, SagaState.COMPENSATING, SagaState.MANUAL_REVIEW)


def _illegal(saga: SagaRecord, event: str, step: StepRecord | None = None) -> IllegalTransition:
    state = str(saga.state) if step is None else f"{saga.state}/{step.state}"
    return IllegalTransition(state=state, event=event)


def _code(code: str) -> str:
    """Error codes written into records follow docs/design.md §2.5."""
    return check_error_code(code)


def _write(saga: SagaRecord, now_ms: int, **changes: Any) -> SagaRecord:
    """The next version of ``saga`` with ``changes``, its effect marks moved to match (in the
    same copy)."""
    steps = marked_steps(changes.pop("steps", saga.steps), now_ms)
    return replace(saga, version=saga.version + 1, updated_at_ms=max(now_ms, saga.updated_at_ms),
                   steps=steps, **changes)


def _find(saga: SagaRecord, name: str, effect_id: str, event: str, compensation: bool) -> StepRecord:
    step = saga.step(name)
    expected = None if step is None else (
        step.compensation_effect_id if compensation else step.effect_id
    )
    if step is None or expected != effect_id:
        raise _illegal(saga, event)
    return step


def _swap(saga: SagaRecord, step: StepRecord, **changes: Any) -> tuple[StepRecord, ...]:
    return tuple(replace(s, **changes) if s.name == step.name else s for s in saga.steps)


def _need(saga: SagaRecord, step: StepRecord, event: str, states: Iterable[StepState],
          saga_states: Iterable[SagaState] = _LIVE, started: bool | None = None) -> None:
    if saga.state not in tuple(saga_states) or step.state not in tuple(states):
        raise _illegal(saga, event, step)
    if started is not None and (step.started_at_ms is not None) != started:
        raise _illegal(saga, event, step)


def direction(saga: SagaRecord) -> SagaState:
    """The live state a saga returns to once nothing needs review."""
    return SagaState.COMPENSATING if saga.rolling_back else SagaState.RUNNING


def unresolved_ambiguity(saga: SagaRecord) -> StepRecord | None:
    """The first step whose outcome (forward or compensation) is unknown, if any."""
    for step in saga.steps:
        if step.state is StepState.AMBIGUOUS:
            return step
        if step.state is StepState.COMPENSATING and step.error_code == codes.AMBIGUOUS_COMPENSATION:
            return step
    return None


def _in_flight(saga: SagaRecord) -> bool:
    return any(s.state is StepState.EXECUTING for s in saga.steps)


def _ambiguity_reason(step: StepRecord) -> tuple[str, str]:
    if step.state is StepState.AMBIGUOUS:
        return codes.AMBIGUOUS_STEP, (
            f"step {step.name!r} effect {step.effect_id} is ambiguous ({step.error_code})"
        )
    return codes.AMBIGUOUS_COMPENSATION, (
        f"compensation of step {step.name!r} effect {step.compensation_effect_id} is ambiguous"
    )


def derive_state(saga: SagaRecord) -> SagaRecord:
    """Derive the saga state after a step moved (same version; callers bump it)."""
    ambiguous = unresolved_ambiguity(saga)
    if ambiguous is not None and saga.state is SagaState.MANUAL_REVIEW:
        if saga.error_code not in codes.AUTO_LIFTED:
            return saga
        code, reason = _ambiguity_reason(ambiguous)  # name the step still to look at
        return replace(saga, error_code=code, reason=reason)
    if ambiguous is not None and not _in_flight(saga):
        code, reason = _ambiguity_reason(ambiguous)
        return replace(saga, state=SagaState.MANUAL_REVIEW, error_code=code, reason=reason)
    if ambiguous is None and saga.state is SagaState.MANUAL_REVIEW:
        if saga.error_code not in codes.AUTO_LIFTED:
            return saga
        cause, why = _rollback_cause(saga)
        saga = replace(saga, state=direction(saga), error_code=cause, reason=why)
    if saga.state is SagaState.RUNNING and saga.rolling_back:
        return replace(saga, state=SagaState.COMPENSATING)
    return saga


def unknown_reason(step: StepRecord, code: str | None) -> str:
    """Why a saga compensates a step declared ``compensate_unknown`` (ids, never payloads)."""
    return (f"step {step.name!r} effect {step.effect_id}: outcome unknown ({code}); "
            "compensated as declared (compensate_unknown)")


def _caught(saga: SagaRecord, index: int) -> bool:
    """A failed step of its own with steps recorded after it: run caught its StepFailed."""
    return saga.steps[index].group is None and index < len(saga.steps) - 1


def _rollback_cause(saga: SagaRecord) -> tuple[str | None, str | None]:
    if not saga.rolling_back:
        return None, None
    for index, step in enumerate(saga.steps):
        if step.state is StepState.FAILED and step.error_code != codes.NOT_STARTED \
                and not _caught(saga, index):
            return step.error_code, f"step {step.name!r} did not commit ({step.error_code})"
        if step.outcome_unknown and step.error_code is not None:
            return step.error_code, unknown_reason(step, step.error_code)
    return codes.CANCELLED, "cancelled"


def _rolls_back(changes: dict[str, Any]) -> bool:
    """A known failure, or an unknown outcome compensated as declared, turns a saga back."""
    return changes.get("state") is StepState.FAILED or bool(changes.get("outcome_unknown"))


def _step_move(saga: SagaRecord, step: StepRecord, now_ms: int, **changes: Any) -> SagaRecord:
    moved = replace(saga, steps=_swap(saga, step, **changes))
    if _rolls_back(changes) and not saga.rolling_back:
        moved = replace(moved, rolling_back=True)
        if saga.state is SagaState.RUNNING:
            code, reason = _rollback_cause(moved)
            moved = replace(moved, error_code=code, reason=reason)
    derived = derive_state(moved)
    return _write(
        saga,
        now_ms,
        steps=derived.steps,
        state=derived.state,
        rolling_back=derived.rolling_back,
        error_code=derived.error_code,
        reason=derived.reason,
    )


# ---------------------------------------------------------------- forward


def _with_patches(saga: SagaRecord, patches: Iterable[str]) -> tuple[str, ...]:
    """The saga's patch ids and the new ones passed by a replay (docs/design.md §3.6)."""
    new = [p for p in dict.fromkeys(patches) if p not in saga.patches]
    return (*saga.patches, *new)


def append_steps(saga: SagaRecord, steps: Iterable[StepRecord], now_ms: int,
                 patches: Iterable[str] = ()) -> SagaRecord:
    """Record the intent of new steps (executing or waiting, attempts 0) before their
    dispatch, with the patch ids the replay passed before them."""
    new = tuple(steps)
    if saga.state is not SagaState.RUNNING or saga.rolling_back or not new:
        raise _illegal(saga, "append_steps")
    names = [s.name for s in (*saga.steps, *new)]
    ids = [e for s in (*saga.steps, *new) for e in (s.effect_id, s.compensation_effect_id)]
    if len(set(names)) != len(names) or len(set(ids)) != len(ids):
        raise _illegal(saga, "append_steps: repeated step name or effect id")
    for step in new:
        if step.state not in _INTENT_STATES or step.attempts:
            raise _illegal(saga, "append_steps", step)
    return _write(saga, now_ms, steps=(*saga.steps, *new), patches=_with_patches(saga, patches))


def claim_step(saga: SagaRecord, name: str, effect_id: str, claimer: str, now_ms: int) -> SagaRecord:
    """Claim the start of a dispatched step (attempts + 1) before its body runs."""
    step = _find(saga, name, effect_id, "claim_step", compensation=False)
    _need(saga, step, "claim_step", (StepState.EXECUTING,), (SagaState.RUNNING,), started=False)
    if saga.rolling_back:
        raise _illegal(saga, "claim_step while rolling back", step)
    return _write(
        saga,
        now_ms,
        steps=_swap(
            saga,
            step,
            attempts=step.attempts + 1,
            started_at_ms=now_ms,
            claimed_by=claimer,
            next_attempt_at_ms=None,
        ),
    )


def _attempt_matches(step: StepRecord, attempt: int) -> bool:
    # An ambiguous step released for a retry before its saga rolled back was never re-claimed.
    started = step.started_at_ms is not None or step.state is StepState.AMBIGUOUS
    return step.attempts == attempt and started


def commit_step(saga: SagaRecord, ref: AttemptRef, result: Any, now_ms: int) -> SagaRecord:
    """Record a step's result; also settles an ambiguous step whose attempt reported late."""
    step = _find(saga, ref.step, ref.effect_id, "commit_step", compensation=False)
    _need(saga, step, "commit_step", (StepState.EXECUTING, StepState.AMBIGUOUS), _ANY_OPEN)
    if not _attempt_matches(step, ref.attempt):
        raise _illegal(saga, "commit_step: another attempt", step)
    return _step_move(
        saga, step, now_ms, state=StepState.COMMITTED, result=result,
        committed_at_ms=_commit_stamp(saga, step, now_ms), error_code=None,
    )


def _commit_stamp(saga: SagaRecord, step: StepRecord, now_ms: int) -> int:
    """When ``step`` commits: ``now``, but after every earlier commit of the saga.

    Compensation walks commits newest first; a worker whose clock runs behind must not make
    its commit look older than one already recorded.
    """
    earlier = [s.committed_at_ms for s in saga.steps if s is not step and s.committed_at_ms]
    return max([now_ms, *(t + 1 for t in earlier)])


def fail_step(saga: SagaRecord, ref: AttemptRef, error_code: str, now_ms: int, *,
              catchable: bool = False) -> SagaRecord:
    """A known failure: the step did not commit; the saga rolls back.

    ``catchable`` (a step body's own known failure): a step that ``run`` asked for alone
    (``ctx.step``, no parallel group) of a saga going forward fails without turning the saga
    back; the next replay raises ``StepFailed`` at that call, and ``run`` decides (caught: it
    goes on; uncaught: the saga compensates, docs/design.md §3.2).
    """
    step = _find(saga, ref.step, ref.effect_id, "fail_step", compensation=False)
    _need(saga, step, "fail_step", (StepState.EXECUTING, StepState.AMBIGUOUS), _ANY_OPEN)
    if not _attempt_matches(step, ref.attempt):
        raise _illegal(saga, "fail_step: another attempt", step)
    if catchable and raised_in_run(saga, step):
        return _write(saga, now_ms, steps=_swap(saga, step, state=StepState.FAILED,
                                                error_code=_code(error_code)))
    return _step_move(saga, step, now_ms, state=StepState.FAILED, error_code=_code(error_code))


def raised_in_run(saga: SagaRecord, step: StepRecord) -> bool:
    """Whether a known failure of ``step`` is left to ``run`` (``StepFailed``): a step of its
    own, executing, in a saga going forward."""
    return (step.group is None and step.state is StepState.EXECUTING and not kind_of(step).held
            and saga.state is SagaState.RUNNING and not saga.rolling_back)


def step_ambiguous(saga: SagaRecord, ref: AttemptRef, error_code: str, now_ms: int, *,
                   compensate: bool = False) -> SagaRecord:
    """A started step's outcome is unknown: never guessed, sent to review once others settle.

    With ``compensate`` (the step declared ``compensate_unknown=True``) the step is compensated
    instead, as if committed: ``outcome_unknown`` is set, its execution effect stays unknown,
    and the saga rolls back as for a known failure, its reason saying the outcome was unknown.
    While rolling back this also takes a step released for a retry that will not run now.
    """
    step = _find(saga, ref.step, ref.effect_id, "step_ambiguous", compensation=False)
    released = saga.rolling_back and step.started_at_ms is None and step.attempts > 0
    _need(saga, step, "step_ambiguous", (StepState.EXECUTING,), _ANY_OPEN,
          started=None if released else True)
    if step.attempts != ref.attempt:
        raise _illegal(saga, "step_ambiguous: another attempt", step)
    if compensate and step.compensator is not None:
        return _step_move(saga, step, now_ms, state=StepState.COMMITTED, outcome_unknown=True,
                          error_code=_code(error_code), result=None, next_attempt_at_ms=None,
                          committed_at_ms=_commit_stamp(saga, step, now_ms))
    return _step_move(saga, step, now_ms, state=StepState.AMBIGUOUS, error_code=_code(error_code))


def release_step(
    saga: SagaRecord, ref: AttemptRef, retry_at_ms: int, error_code: str, now_ms: int
) -> SagaRecord:
    """Put a started idempotent step back to be re-dispatched at ``retry_at_ms``.

    Never while rolling back: no retry would be claimed, so the attempt is ambiguous instead.
    """
    step = _find(saga, ref.step, ref.effect_id, "release_step", compensation=False)
    _need(saga, step, "release_step", (StepState.EXECUTING,), _LIVE, started=True)
    if saga.rolling_back:
        raise _illegal(saga, "release_step while rolling back", step)
    if step.attempts != ref.attempt:
        raise _illegal(saga, "release_step: another attempt", step)
    return _write(
        saga,
        now_ms,
        steps=_swap(
            saga, step, started_at_ms=None, claimed_by=None, next_attempt_at_ms=retry_at_ms,
            error_code=_code(error_code), dispatched_at_ms=None,
        ),
    )


def abandon_step(saga: SagaRecord, name: str, effect_id: str, now_ms: int, *,
                 nothing_committed: bool = False) -> SagaRecord:
    """While rolling back, a step never claimed is failed before it can begin.

    ``nothing_committed``: a step released for a retry whose last attempt provably committed
    nothing (a ``retry_on`` failure of a step that is not idempotent) is failed too, with the
    code of that failure; without it, an earlier attempt makes the move illegal.
    """
    step = _find(saga, name, effect_id, "abandon_step", compensation=False)
    _need(saga, step, "abandon_step", _INTENT_STATES, started=False)
    if not saga.rolling_back:
        raise _illegal(saga, "abandon_step while going forward", step)
    if step.attempts > 0 and not (nothing_committed and step.state is StepState.EXECUTING):
        # an earlier attempt began: its outcome is not "never happened"
        raise _illegal(saga, "abandon_step after an attempt", step)
    code = step.error_code if step.attempts > 0 and step.error_code else codes.NOT_STARTED
    return _step_move(saga, step, now_ms, state=StepState.FAILED, error_code=code)


def wake_step(saga: SagaRecord, name: str, effect_id: str, result: Any, now_ms: int,
              signal_id: str | None = None) -> SagaRecord:
    """A waiting step commits with ``result`` (a timer fired, a signal came or the wait timed
    out); the signal it received, if any, is marked consumed by it in the same write."""
    step = _find(saga, name, effect_id, "wake_step", compensation=False)
    _need(saga, step, "wake_step", (StepState.WAITING,), (SagaState.RUNNING,))
    if saga.rolling_back:
        raise _illegal(saga, "wake_step while rolling back", step)
    signals = saga.signals
    if signal_id is not None:
        found = [s for s in signals if s.signal_id == signal_id and s.consumed_by is None]
        if not found:
            raise _illegal(saga, "wake_step with a signal not there or consumed", step)
        signals = tuple(replace(s, consumed_by=name) if s.signal_id == signal_id else s
                        for s in signals)
    moved = _step_move(saga, step, now_ms, state=StepState.COMMITTED, result=result,
                       committed_at_ms=_commit_stamp(saga, step, now_ms), attempts=1)
    return replace(moved, signals=signals)


def child_review_reason(child_id: str) -> str:
    """The reason a parent gives while its child saga waits for an operator."""
    return f"child saga {child_id!r} needs review"


def _lift_child_review(saga: SagaRecord, child_id: str) -> SagaRecord:
    """A parent in review because of this child goes back the way it was going."""
    if saga.state is not SagaState.MANUAL_REVIEW or saga.error_code != codes.CHILD_IN_REVIEW:
        return saga
    if saga.reason != child_review_reason(child_id):
        return saga  # in review for another child
    cause, why = _rollback_cause(saga)
    return replace(saga, state=direction(saga), error_code=cause, reason=why)


def child_settled(saga: SagaRecord, name: str, child_id: str, outcome: StepState, result: Any,
                  now_ms: int) -> SagaRecord:
    """A child saga settled (docs/design.md §3.7): its waiting step commits with the child's
    result (``committed``) or fails (``failed``: the child compensated); a child step being
    compensated is done (``compensated``). A review that named this child is lifted."""
    step = saga.step(name)
    if step is None or child_id_of(step) != child_id:
        raise _illegal(saga, "child_settled")
    _need(saga, step, "child_settled", (StepState.WAITING, StepState.COMPENSATING), _ANY_OPEN)
    lifted = _lift_child_review(saga, child_id)
    if step.state is StepState.WAITING and outcome is StepState.COMMITTED:
        return _step_move(lifted, step, now_ms, state=StepState.COMMITTED, result=result,
                          committed_at_ms=_commit_stamp(saga, step, now_ms), attempts=1)
    if step.state is StepState.WAITING and outcome is StepState.FAILED:
        return _step_move(lifted, step, now_ms, state=StepState.FAILED,
                          error_code=codes.CHILD_COMPENSATED)
    if step.state is StepState.COMPENSATING and outcome is StepState.COMPENSATED:
        return _step_move(lifted, step, now_ms, state=StepState.COMPENSATED, error_code=None,
                          next_attempt_at_ms=None)
    raise _illegal(saga, f"child_settled: {outcome}", step)


def refuse_child(saga: SagaRecord, name: str, child_id: str, error_code: str,
                 now_ms: int) -> SagaRecord:
    """A child step whose saga would pass a limit (depth, children per saga) fails before the
    child exists (docs/concepts.md "Limits"): the parent rolls back as for a failed step."""
    step = saga.step(name)
    if step is None or child_id_of(step) != child_id:
        raise _illegal(saga, "refuse_child")
    _need(saga, step, "refuse_child", (StepState.WAITING,), _ANY_OPEN)
    return _step_move(saga, step, now_ms, state=StepState.FAILED, error_code=_code(error_code))


def mark_redispatched(saga: SagaRecord, name: str, now_ms: int) -> SagaRecord:
    """Note that an unclaimed step or compensator was sent again (so it is not stale)."""
    step = saga.step(name)
    if step is None:
        raise _illegal(saga, "mark_redispatched")
    _need(saga, step, "mark_redispatched", (StepState.EXECUTING, StepState.COMPENSATING),
          started=False)
    return _write(saga, now_ms, steps=_swap(saga, step, dispatched_at_ms=now_ms))


def _gate(saga: SagaRecord, name: str, approval_id: str, event: str) -> StepRecord:
    step = saga.step(name)
    if step is None or step.approval_id != approval_id:
        raise _illegal(saga, event)
    _need(saga, step, event, (APPROVAL.held_state,), _ANY_OPEN)
    return step


def pass_gate(saga: SagaRecord, name: str, approval_id: str, result: Any, now_ms: int) -> SagaRecord:
    """An approval gate was approved and its token consumed: the gate step commits."""
    step = _gate(saga, name, approval_id, "pass_gate")
    if saga.rolling_back or saga.state is not SagaState.RUNNING:
        raise _illegal(saga, "pass_gate while not going forward", step)
    return _step_move(saga, step, now_ms, state=StepState.COMMITTED, result=result,
                      committed_at_ms=_commit_stamp(saga, step, now_ms), attempts=1)


def fail_gate(saga: SagaRecord, name: str, approval_id: str, error_code: str,
              now_ms: int) -> SagaRecord:
    """An approval gate was denied or expired: it counts as not committed; the saga rolls back."""
    step = _gate(saga, name, approval_id, "fail_gate")
    return _step_move(saga, step, now_ms, state=StepState.FAILED, error_code=_code(error_code))


# ---------------------------------------------------------------- compensation


def begin_compensation(saga: SagaRecord, name: str, now_ms: int) -> SagaRecord:
    """Record the intent to compensate a committed step (compensation attempts + 1)."""
    step = saga.step(name)
    if step is None:
        raise _illegal(saga, "begin_compensation")
    _need(saga, step, "begin_compensation",
          (StepState.COMMITTED, StepState.COMPENSATION_FAILED), (SagaState.COMPENSATING,))
    if step.compensator is None:
        raise _illegal(saga, "begin_compensation of a step with nothing to undo", step)
    return _write(
        saga,
        now_ms,
        steps=_swap(
            saga, step, state=StepState.COMPENSATING,
            compensation_attempts=step.compensation_attempts + 1,
            started_at_ms=None, claimed_by=None, next_attempt_at_ms=None,
            dispatched_at_ms=now_ms,
        ),
    )


def claim_compensation(
    saga: SagaRecord, name: str, effect_id: str, claimer: str, now_ms: int
) -> SagaRecord:
    """Claim the start of a dispatched compensator before its body runs."""
    step = _find(saga, name, effect_id, "claim_compensation", compensation=True)
    _need(saga, step, "claim_compensation", (StepState.COMPENSATING,),
          (SagaState.COMPENSATING,), started=False)
    return _write(saga, now_ms, steps=_swap(saga, step, started_at_ms=now_ms, claimed_by=claimer))


def withdraw_claim(saga: SagaRecord, ref: AttemptRef, claimer: str, now_ms: int) -> SagaRecord:
    """Take back a claim whose body never began (its delivery lost the claim's reply, or cannot
    read the record): the step is as it was before the claim, to be claimed again.

    Only the claimer itself knows its body never began, so only its own claim (``claimer`` is
    the tag it wrote) of the attempt ``ref`` names is taken back; anything else is illegal.
    """
    event = "withdraw_claim"
    found = saga.step(ref.step)
    compensation = found is not None and found.compensation_effect_id == ref.effect_id
    step = _find(saga, ref.step, ref.effect_id, event, compensation=compensation)
    state = StepState.COMPENSATING if compensation else StepState.EXECUTING
    _need(saga, step, event, (state,), started=True)
    attempt = step.compensation_attempts if compensation else step.attempts
    if step.claimed_by != claimer or attempt != ref.attempt:
        raise _illegal(saga, f"{event}: another claim", step)
    if compensation:  # a compensation claim counts no attempt (begin_compensation did)
        return _write(saga, now_ms, steps=_swap(saga, step, started_at_ms=None, claimed_by=None))
    return _write(saga, now_ms, steps=_swap(saga, step, started_at_ms=None, claimed_by=None,
                                            attempts=step.attempts - 1))


def _compensation_attempt(saga: SagaRecord, ref: AttemptRef, event: str) -> StepRecord:
    step = _find(saga, ref.step, ref.effect_id, event, compensation=True)
    _need(saga, step, event, (StepState.COMPENSATING,), _ANY_OPEN, started=True)
    if step.compensation_attempts != ref.attempt:
        raise _illegal(saga, f"{event}: another attempt", step)
    return step


def compensation_succeeded(saga: SagaRecord, ref: AttemptRef, now_ms: int) -> SagaRecord:
    """The compensator returned: the step is undone."""
    step = _compensation_attempt(saga, ref, "compensation_succeeded")
    return _step_move(saga, step, now_ms, state=StepState.COMPENSATED, error_code=None,
                      next_attempt_at_ms=None)


def compensation_failed(
    saga: SagaRecord, ref: AttemptRef, retry_at_ms: int, now_ms: int
) -> SagaRecord:
    """The compensator raised: retry at ``retry_at_ms`` (the planner checks the budget)."""
    step = _compensation_attempt(saga, ref, "compensation_failed")
    return _step_move(
        saga, step, now_ms, state=StepState.COMPENSATION_FAILED,
        error_code=codes.COMPENSATION_FAILED, next_attempt_at_ms=retry_at_ms,
        started_at_ms=None, claimed_by=None,
    )


def compensation_ambiguous(saga: SagaRecord, ref: AttemptRef, now_ms: int) -> SagaRecord:
    """A claimed compensator vanished: its outcome is unknown, the saga goes to review."""
    step = _compensation_attempt(saga, ref, "compensation_ambiguous")
    return _step_move(saga, step, now_ms, state=StepState.COMPENSATING,
                      error_code=codes.AMBIGUOUS_COMPENSATION)


def unknown_task(saga: SagaRecord, name: str, effect_id: str, task: str, now_ms: int) -> SagaRecord:
    """A worker received the task of an unclaimed effect and has no such task registered:
    stop for an operator (``unknown_task``) instead of re-sending it forever.

    Only an effect nobody claimed is taken: its body never began (a body runs after a claim,
    and no claim is accepted once the saga is in review), so the operator may deploy the task
    and ``resume`` (it is sent again under the same effect id) or ``resolve`` it.
    """
    step = saga.step(name)
    compensation = step is not None and step.compensation_effect_id == effect_id
    step = _find(saga, name, effect_id, "unknown_task", compensation)
    state = StepState.COMPENSATING if compensation else StepState.EXECUTING
    _need(saga, step, "unknown_task", (state,),
          (SagaState.COMPENSATING,) if compensation else (SagaState.RUNNING,), started=False)
    if saga.rolling_back and not compensation:
        raise _illegal(saga, "unknown_task: the step is abandoned, not sent", step)
    moved = _step_move(saga, step, now_ms, error_code=codes.UNKNOWN_TASK)
    what = "compensator" if compensation else "task"
    reason = (f"{what} {task!r} of step {name!r} (effect {effect_id}) is not registered on the "
              "worker that received it")
    return replace(moved, state=SagaState.MANUAL_REVIEW, error_code=codes.UNKNOWN_TASK,
                   reason=reason)


# ---------------------------------------------------------------- saga level


def complete(saga: SagaRecord, now_ms: int, patches: Iterable[str] = (),
             result: Any = None) -> SagaRecord:
    """Every step committed and run() returned ``result``: the saga is completed."""
    if saga.state is not SagaState.RUNNING or saga.rolling_back:
        raise _illegal(saga, "complete")
    # a failed step of a saga going forward raised StepFailed in run, which caught it
    if any(s.state not in (StepState.COMMITTED, StepState.FAILED) for s in saga.steps):
        raise _illegal(saga, "complete with uncommitted steps")
    return _write(saga, now_ms, state=SagaState.COMPLETED, error_code=None, reason=None,
                  patches=_with_patches(saga, patches), result=result)


def start_compensation(saga: SagaRecord, error_code: str, reason: str, now_ms: int) -> SagaRecord:
    """Turn a running saga back (cancel, or run() refused to go on)."""
    if saga.state is not SagaState.RUNNING:
        raise _illegal(saga, "start_compensation")
    return _write(saga, now_ms, state=SagaState.COMPENSATING, rolling_back=True,
                  error_code=_code(error_code), reason=reason, **_unwaited(saga))


_UNDONE = (StepState.COMPENSATED, StepState.FAILED)


def cancel(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """Roll back a running saga, or one in review whose outcomes are all known."""
    reviewable = saga.state is SagaState.MANUAL_REVIEW and unresolved_ambiguity(saga) is None
    if saga.state is not SagaState.RUNNING and not reviewable:
        raise _illegal(saga, "cancel")
    return _write(saga, now_ms, state=SagaState.COMPENSATING, rolling_back=True,
                  error_code=codes.CANCELLED, reason="cancelled", **_unwaited(saga))


def _unwaited(saga: SagaRecord) -> dict[str, Any]:
    """A saga that turns back waits for no more signals: those no wait consumed are dropped
    and counted, so even a saga at its size limit can be cancelled (docs/concepts.md "Limits")."""
    kept = tuple(s for s in saga.signals if s.consumed_by is not None)
    dropped = len(saga.signals) - len(kept)
    if not dropped:
        return {}
    return {"signals": kept, "signals_dropped": saga.signals_dropped + dropped}


def _nothing_to_undo(step: StepRecord) -> bool:
    return step.state is StepState.COMMITTED and step.compensator is None


def finish_compensation(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """No committed step remains: the saga is compensated."""
    if saga.state is not SagaState.COMPENSATING:
        raise _illegal(saga, "finish_compensation")
    if any(s.state not in _UNDONE and not _nothing_to_undo(s) for s in saga.steps):
        raise _illegal(saga, "finish_compensation with steps left")
    return _write(saga, now_ms, state=SagaState.COMPENSATED)


def reopen(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """A completed child saga compensates as a unit because its parent compensates."""
    if saga.state is not SagaState.COMPLETED or saga.parent is None:
        raise _illegal(saga, "reopen")
    return _write(saga, now_ms, state=SagaState.COMPENSATING, rolling_back=True,
                  error_code=codes.PARENT_COMPENSATING, reason="its parent saga compensates")


def to_manual_review(saga: SagaRecord, error_code: str, reason: str, now_ms: int) -> SagaRecord:
    """Stop and wait for an operator, saying why."""
    if saga.state not in _LIVE:
        raise _illegal(saga, "to_manual_review")
    if not reason:
        raise _illegal(saga, "to_manual_review without a reason")
    return _write(saga, now_ms, state=SagaState.MANUAL_REVIEW, error_code=_code(error_code),
                  reason=reason, exception=None, traceback=None)


def resume(saga: SagaRecord, now_ms: int) -> SagaRecord:
    """Lift manual review once no outcome is unknown; exhausted compensations get a fresh budget."""
    if saga.state is not SagaState.MANUAL_REVIEW:
        raise _illegal(saga, "resume")
    if unresolved_ambiguity(saga) is not None:
        raise _illegal(saga, "resume with an unresolved step")
    steps = tuple(
        replace(s, compensation_attempts=0, next_attempt_at_ms=None)
        if s.state is StepState.COMPENSATION_FAILED
        else s
        for s in saga.steps
    )
    lifted = replace(saga, steps=steps)
    cause, why = _rollback_cause(lifted)
    return _write(saga, now_ms, steps=steps, state=direction(saga), error_code=cause, reason=why,
                  exception=None, traceback=None)


def with_exception(saga: SagaRecord, name: str, text: str | None,
                   frames: str | None = None) -> SagaRecord:
    """``saga`` with step ``name``'s exception text and traceback summary set (or cleared);
    part of the write that records the outcome, so no version of its own."""
    step = saga.step(name)
    if step is not None and step.exception == text and step.traceback == frames:
        return saga  # nothing to change: no copy
    return replace(saga, steps=tuple(replace(s, exception=text, traceback=frames)
                                     if s.name == name else s for s in saga.steps))


def one_write(before: SagaRecord, after: SagaRecord) -> SagaRecord:
    """Collapse several transitions applied to ``before`` into a single write (version + 1)."""
    return replace(after, version=before.version + 1)
