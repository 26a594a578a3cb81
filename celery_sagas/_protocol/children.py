"""Child sagas (docs/design.md §3.7), judged purely.

``ctx.child(definition, input)`` records a ``waiting`` child step in the parent whose kwargs
name the child's definition, input and saga id (by default derived from the parent's id and the
call's position, so a replay starts the same child). The child saga carries a ``ParentRef``;
when it settles, its parent's step moves as ``settle`` says:

    child completed    -> the waiting step commits with the child's result
    child compensated  -> the waiting step fails (child_compensated): the parent rolls back
    child in review    -> the parent goes to review, its reason naming the child
    child compensated while the parent undoes the (committed) child step -> the step is undone

When the parent compensates, a committed child step is "compensated" by reopening the completed
child (``moves.reopen``), which then undoes its own steps in reverse order.
"""

from __future__ import annotations

import hashlib

from .._records import SagaRecord, SagaState, StepRecord, StepState
from . import codes, moves
from .kinds import child_id_of

__all__ = ["child_id_of", "child_saga_id", "settle"]

_MAX_ID = 120  # room for the ".<n>" the engine may add to keep a child in its parent's bucket


def child_saga_id(parent_id: str, position: int) -> str:
    """The default id of the child started at ``position`` (0-based) of its parent's steps,
    before the engine moves it into its parent's bucket (docs/design.md §4.2)."""
    candidate = f"{parent_id}/{position + 1}"
    if len(candidate) <= _MAX_ID:
        return candidate
    digest = hashlib.sha256(f"{parent_id}\0{position}".encode()).hexdigest()[:48]
    return f"child-{digest}"


def settle(parent: SagaRecord, step_name: str, child: SagaRecord, now_ms: int) -> SagaRecord | None:
    """The parent after its child ``child`` settled or went to review; None when nothing is to
    be written (the step moved on already, the child is still going, or the parent is final)."""
    step = parent.step(step_name)
    if step is None or child_id_of(step) != child.saga_id or parent.state.final:
        return None
    if step.state not in (StepState.WAITING, StepState.COMPENSATING):
        return None
    if child.state is SagaState.MANUAL_REVIEW:
        reason = moves.child_review_reason(child.saga_id)
        if parent.state is SagaState.MANUAL_REVIEW:
            return None
        return moves.to_manual_review(parent, codes.CHILD_IN_REVIEW, reason, now_ms)
    outcome = _outcome(step, child)
    if outcome is None:
        return None
    return moves.child_settled(parent, step_name, child.saga_id, outcome, child.result, now_ms)


def _outcome(step: StepRecord, child: SagaRecord) -> StepState | None:
    if step.state is StepState.WAITING and child.state is SagaState.COMPLETED:
        return StepState.COMMITTED
    if step.state is StepState.WAITING and child.state is SagaState.COMPENSATED:
        return StepState.FAILED
    if step.state is StepState.COMPENSATING and child.state is SagaState.COMPENSATED:
        return StepState.COMPENSATED
    return None
