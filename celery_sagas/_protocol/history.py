"""A saga's history, derived from the records a write replaces (docs/design.md §2.6).

Theory of operation. Every write of a saga record goes through one place (the repository's
compare-and-set, its create, and the notes a reader applies); that place hands this module
the record before the write and the record the write stores, and ``recorded`` returns the
latter with the history of the former plus what changed between the two. No move has to
remember to write history, and a transition added later shows up here as a generic ``step``
or ``state`` entry without teaching anyone. Derived entries hold ids, names, states, codes
and times, never a payload, so the history needs no sealing. Who acted and why cannot be
read from a diff: an operator's write passes an ``OperatorAction``, appended before the
transitions it caused.

The history is only ever appended to (``before.history`` is copied, never what ``after``
carries); past ``limit`` entries the oldest fold into ``history_folded``.
"""

from __future__ import annotations

from collections.abc import Iterator

from .._frozen import replace
from .._records import (
    EMPTY_HISTORY,
    HistoryEntry,
    HistoryEvent,
    OperatorAction,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
    history_of,
)
from .kinds import kind_of

__all__ = ["DEFAULT_HISTORY_LIMIT", "archived", "bounded", "recorded", "transitions"]

DEFAULT_HISTORY_LIMIT = 200

E = HistoryEvent
_COMPENSATION_STATES = (StepState.COMPENSATING, StepState.COMPENSATED, StepState.COMPENSATION_FAILED)


def recorded(before: SagaRecord | None, after: SagaRecord, *,
             action: OperatorAction | None = None, at_ms: int | None = None,
             limit: int | None = DEFAULT_HISTORY_LIMIT) -> SagaRecord:
    """``after`` carrying ``before``'s history plus the entries of this write: the operator's
    ``action`` (if any), then what changed from ``before`` (None: the saga is created), at
    ``at_ms`` (default: ``after.updated_at_ms``); the oldest folded past ``limit`` (None: no
    bound, for a reader applying notes)."""
    at = after.updated_at_ms if at_ms is None else at_ms
    new = list(transitions(before, after, at, action))
    history = history_of(before.history) if before is not None else EMPTY_HISTORY
    folded = before.history_folded if before is not None else 0
    history = history.appended(new)
    if history is not after.history or folded != after.history_folded:
        after = replace(after, history=history, history_folded=folded)
    return after if limit is None else bounded(after, limit)


def archived(saga: SagaRecord, at_ms: int) -> SagaRecord:
    """``saga`` as retention hands it to the archive: its history ends with ``archived``."""
    return replace(saga, history=history_of(saga.history).appended([HistoryEntry(at_ms, E.ARCHIVED)]))


def bounded(saga: SagaRecord, limit: int) -> SagaRecord:
    """``saga`` with at most ``limit`` history entries, the oldest counted as folded."""
    extra = len(saga.history) - limit
    if extra <= 0:
        return saga
    return replace(saga, history=history_of(saga.history)[extra:],
                   history_folded=saga.history_folded + extra)


def transitions(before: SagaRecord | None, after: SagaRecord, at_ms: int,
                action: OperatorAction | None = None) -> Iterator[HistoryEntry]:
    """The entries of one write, in order: the action, the creation, signals received, step
    transitions in step order, then the saga's change of state."""
    signal_action = action is not None and action.event is E.SIGNAL
    if action is not None and not signal_action:
        yield action.entry(at_ms)
    if before is None:
        yield HistoryEntry(at_ms, E.CREATED, ref=after.parent.saga_id if after.parent else None)
    yield from _signals(before, after, action if signal_action else None)
    old_steps = {s.name: s for s in before.steps} if before is not None else {}
    for step in after.steps:
        old = old_steps.get(step.name)
        if old is not step:
            yield from _step(old, step, at_ms, after)
    if before is not None:
        yield from _caught(before, after, at_ms)
    if before is not None and after.signals_dropped > before.signals_dropped:
        dropped = after.signals_dropped - before.signals_dropped
        yield HistoryEntry(at_ms, E.SIGNALS_DROPPED, attempt=dropped)
    if before is not None and before.state is not after.state:
        yield HistoryEntry(at_ms, E.STATE, state=str(after.state), code=after.error_code,
                           reason=after.reason)


def _caught(before: SagaRecord, after: SagaRecord, at: int) -> Iterator[HistoryEntry]:
    """``run`` caught a step's ``StepFailed`` (docs/design.md §3.2) when the saga, going
    forward, recorded a step after the failed one (or completed) in this write."""
    if after.rolling_back or after.state not in (SagaState.RUNNING, SagaState.COMPLETED):
        return
    last = len(before.steps) - 1
    for index, step in enumerate(after.steps):
        if step.state is not StepState.FAILED or step.group is not None:
            continue
        went_on = index < len(after.steps) - 1 or after.state is SagaState.COMPLETED
        was_last = index >= last and not (index == last and before.state is SagaState.COMPLETED)
        if went_on and was_last:
            yield HistoryEntry(at, E.CAUGHT, step.name, step.attempts, code=step.error_code)


def _signals(before: SagaRecord | None, after: SagaRecord,
             action: OperatorAction | None) -> Iterator[HistoryEntry]:
    if before is not None and after.signals is before.signals:
        return
    known = {s.signal_id for s in before.signals} if before is not None else set()
    for signal in after.signals:
        if signal.signal_id in known:
            continue
        by = action if action is not None and action.ref == signal.signal_id else None
        yield HistoryEntry(signal.sent_at_ms, E.SIGNAL, code=signal.name, ref=signal.signal_id,
                           actor=by.actor if by else None, reason=by.reason if by else None)


def _step(old: StepRecord | None, new: StepRecord, at: int,
          saga: SagaRecord) -> Iterator[HistoryEntry]:
    if old is None:
        yield _intent(new, at)
        return
    if _failed_and_sent_again(old, new):
        # a retry due at once (the jitter drew 0) is sent by the write of the failure itself
        yield HistoryEntry(at, E.COMPENSATION_FAILED, new.name, old.compensation_attempts,
                           code=new.error_code, due_ms=at)
        yield HistoryEntry(at, E.COMPENSATION_INTENT, new.name, new.compensation_attempts)
        if new.started_at_ms is not None:
            yield _claim(new, at)
        return
    claimed = new.started_at_ms is not None and new.started_at_ms != old.started_at_ms
    if claimed:
        yield _claim(new, at)
    if _withdrawn(old, new):
        yield HistoryEntry(at, E.CLAIM_WITHDRAWN, new.name, _attempt(old), ref=old.claimed_by)
    elif new.state is not old.state:
        yield _moved(new, at, saga)
    elif new.state is StepState.EXECUTING and new.next_attempt_at_ms is not None \
            and new.next_attempt_at_ms != old.next_attempt_at_ms:
        yield HistoryEntry(at, E.RETRY, new.name, new.attempts, code=new.error_code,
                           due_ms=new.next_attempt_at_ms)
    elif new.state is StepState.COMPENSATING and new.error_code is not None \
            and new.error_code != old.error_code:
        yield HistoryEntry(at, E.COMPENSATION_AMBIGUOUS, new.name, new.compensation_attempts,
                           code=new.error_code)
    elif not claimed and new.dispatched_at_ms is not None \
            and new.dispatched_at_ms != old.dispatched_at_ms:
        yield HistoryEntry(at, E.RESENT, new.name, _attempt(new))


def _failed_and_sent_again(old: StepRecord, new: StepRecord) -> bool:
    """A claimed compensator that raised and its next attempt sent, in one write: the step
    compensates still, under a higher attempt (a claim taken back keeps its attempt)."""
    return old.state is StepState.COMPENSATING and new.state is StepState.COMPENSATING \
        and old.started_at_ms is not None and new.compensation_attempts > old.compensation_attempts


def _withdrawn(old: StepRecord, new: StepRecord) -> bool:
    """A claim taken back by its claimer (``moves.withdraw_claim``): started no more, in the
    same state, with no retry due (a released retry is ``retry``)."""
    return old.started_at_ms is not None and new.started_at_ms is None \
        and new.state is old.state and new.next_attempt_at_ms is None


def _attempt(step: StepRecord) -> int:
    return step.compensation_attempts if step.state in _COMPENSATION_STATES else step.attempts


def _intent(step: StepRecord, at: int) -> HistoryEntry:
    """A step appended: its intent, or the wait it opens (as its kind says, docs/design.md §3.11)."""
    return kind_of(step).opened(step, at)


def _claim(step: StepRecord, at: int) -> HistoryEntry:
    if step.state in _COMPENSATION_STATES:
        return HistoryEntry(at, E.COMPENSATION_CLAIMED, step.name, step.compensation_attempts,
                            ref=step.claimed_by)
    return HistoryEntry(at, E.CLAIMED, step.name, step.attempts, ref=step.claimed_by)


def _moved(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    """A step's change of state, named for what it means for the step's kind."""
    state, name = step.state, step.name
    if kind_of(step).held and state in (StepState.COMMITTED, StepState.FAILED):
        # the timer fired, the signal came (or the wait timed out), the child ended, the
        # approval was decided: as the step's kind says
        return kind_of(step).ended(step, at, saga)
    if state is StepState.COMMITTED and step.outcome_unknown:
        # compensate_unknown: the outcome is unknown; the saga compensates it as declared
        return HistoryEntry(at, E.AMBIGUOUS, name, step.attempts, code=step.error_code)
    if state is StepState.COMMITTED:
        return HistoryEntry(at, E.COMMITTED, name, step.attempts)
    if state is StepState.FAILED:
        return HistoryEntry(at, E.FAILED, name, step.attempts, code=step.error_code)
    if state is StepState.AMBIGUOUS:
        return HistoryEntry(at, E.AMBIGUOUS, name, step.attempts, code=step.error_code)
    if state is StepState.COMPENSATING:
        return HistoryEntry(at, E.COMPENSATION_INTENT, name, step.compensation_attempts)
    if state is StepState.COMPENSATED:
        return HistoryEntry(at, E.COMPENSATED, name, step.compensation_attempts)
    if state is StepState.COMPENSATION_FAILED:
        return HistoryEntry(at, E.COMPENSATION_FAILED, name, step.compensation_attempts,
                            code=step.error_code, due_ms=step.next_attempt_at_ms)
    return HistoryEntry(at, E.STEP, name, _attempt(step), state=str(state), code=step.error_code)
