"""The history derivation (docs/design.md §2.5), from tables: every move of the protocol, the
entries its write appends; the history is only ever appended to and folds past its bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.history import bounded, recorded
from celery_sagas._protocol.kinds import APPROVAL_TASK, CHILD_TASK, SIGNAL_TASK, TIMER_TASK
from celery_sagas._protocol.notes import ClaimNote, SignalNote, apply_notes
from celery_sagas._records import (
    AttemptRef,
    HistoryEntry,
    HistoryEvent,
    OperatorAction,
    ParentRef,
    SagaRecord,
    SagaState,
    SignalRecord,
)
from tests.unit.protocol_builders import (
    AM,
    CF,
    CM,
    NOW,
    P0,
    P1,
    X0,
    X1,
    cx,
    fx,
    intent,
    saga,
    step,
)

E = HistoryEvent
Move = Callable[[SagaRecord], SagaRecord]


def _ref(record: SagaRecord, name: str = "s", compensation: bool = False) -> AttemptRef:
    found = record.step(name)
    assert found is not None
    return AttemptRef.compensation(found) if compensation else AttemptRef.execution(found)


def _wait(task: str, **changes: Any) -> SagaRecord:
    return saga(intent("w", task=task, compensator=None, state=moves.StepState.WAITING,
                       dispatched_at_ms=None, **changes))


def _gate() -> SagaRecord:
    return saga(step("awaiting-approval", "g", task=APPROVAL_TASK, compensator=None))


def _signalled() -> SagaRecord:
    waiting = _wait(SIGNAL_TASK, kwargs={"signal": "paid"})
    return replace(waiting, signals=(SignalRecord("sig-1", "paid", {"amount": 3}, NOW - 5),))


# (name, before, move, expected entries as (event, step, attempt, state, code, ref, due_ms))
CASES: list[tuple[str, SagaRecord, Move, list[tuple[Any, ...]]]] = [
    ("claim", saga(step(X0)), lambda r: moves.claim_step(r, "s", fx("s"), "w-1", NOW),
     [(E.CLAIMED, "s", 1, None, None, "w-1", None)]),
    ("claim withdrawn", moves.claim_step(saga(step(X0)), "s", fx("s"), "w-1", NOW - 1),
     lambda r: moves.withdraw_claim(r, _ref(r), "w-1", NOW),
     [(E.CLAIM_WITHDRAWN, "s", 1, None, None, "w-1", None)]),
    ("compensation claim withdrawn",
     moves.claim_compensation(saga(step(P0), state=SagaState.COMPENSATING), "s", "cx-s", "w-2",
                              NOW - 1),
     lambda r: moves.withdraw_claim(r, _ref(r, compensation=True), "w-2", NOW),
     [(E.CLAIM_WITHDRAWN, "s", 1, None, None, "w-2", None)]),
    ("commit", saga(step(X1)), lambda r: moves.commit_step(r, _ref(r), {"ok": 1}, NOW),
     [(E.COMMITTED, "s", 1, None, None, None, None)]),
    ("known failure", saga(step(X1)),
     lambda r: moves.fail_step(r, _ref(r), "card_declined", NOW),
     [(E.FAILED, "s", 1, None, "card_declined", None, None),
      (E.STATE, None, None, "compensating", "card_declined", None, None)]),
    ("ambiguity", saga(step(X1)),
     lambda r: moves.step_ambiguous(r, _ref(r), codes.WORKER_LOST, NOW),
     [(E.AMBIGUOUS, "s", 1, None, codes.WORKER_LOST, None, None),
      (E.STATE, None, None, "manual-review", codes.AMBIGUOUS_STEP, None, None)]),
    ("release for a retry", saga(step(X1)),
     lambda r: moves.release_step(r, _ref(r), NOW + 60_000, codes.TIME_LIMIT, NOW),
     [(E.RETRY, "s", 1, None, codes.TIME_LIMIT, None, NOW + 60_000)]),
    ("re-sent by the sweep", saga(step(X0)), lambda r: moves.mark_redispatched(r, "s", NOW),
     [(E.RESENT, "s", 0, None, None, None, None)]),
    ("intent", saga(step(CM, "a")),
     lambda r: moves.append_steps(r, [intent("b")], NOW),
     [(E.INTENT, "b", None, None, None, None, None)]),
    ("compensation intent", saga(step(CM), state=SagaState.COMPENSATING),
     lambda r: moves.begin_compensation(r, "s", NOW),
     [(E.COMPENSATION_INTENT, "s", 1, None, None, None, None)]),
    ("compensation claim", saga(step(P0), state=SagaState.COMPENSATING),
     lambda r: moves.claim_compensation(r, "s", "cx-s", "w-2", NOW),
     [(E.COMPENSATION_CLAIMED, "s", 1, None, None, "w-2", None)]),
    ("compensated", saga(step(P1), state=SagaState.COMPENSATING),
     lambda r: moves.compensation_succeeded(r, _ref(r, compensation=True), NOW),
     [(E.COMPENSATED, "s", 1, None, None, None, None)]),
    ("compensation failed", saga(step(P1), state=SagaState.COMPENSATING),
     lambda r: moves.compensation_failed(r, _ref(r, compensation=True), NOW + 9, NOW),
     [(E.COMPENSATION_FAILED, "s", 1, None, codes.COMPENSATION_FAILED, None, NOW + 9)]),
    ("compensation ambiguous", saga(step(P1), state=SagaState.COMPENSATING),
     lambda r: moves.compensation_ambiguous(r, _ref(r, compensation=True), NOW),
     [(E.COMPENSATION_AMBIGUOUS, "s", 1, None, codes.AMBIGUOUS_COMPENSATION, None, None),
      (E.STATE, None, None, "manual-review", codes.AMBIGUOUS_COMPENSATION, None, None)]),
    ("complete", saga(step(CM)), lambda r: moves.complete(r, NOW),
     [(E.STATE, None, None, "completed", None, None, None)]),
    ("cancel", saga(step(CM)), lambda r: moves.cancel(r, NOW),
     [(E.STATE, None, None, "compensating", codes.CANCELLED, None, None)]),
    ("timer set", saga(step(CM, "a")),
     lambda r: moves.append_steps(r, [intent("t", task=TIMER_TASK, state=moves.StepState.WAITING,
                                              wake_at_ms=NOW + 500, compensator=None)], NOW),
     [(E.TIMER_SET, "t", None, None, None, None, NOW + 500)]),
    ("timer fired", _wait(TIMER_TASK), lambda r: moves.wake_step(r, "w", fx("w"), None, NOW),
     [(E.TIMER_FIRED, "w", None, None, None, None, None)]),
    ("signal consumed", _signalled(),
     lambda r: moves.wake_step(r, "w", fx("w"), {"amount": 3}, NOW, "sig-1"),
     [(E.SIGNAL_CONSUMED, "w", None, None, "paid", "sig-1", None)]),
    ("signal wait timed out", _wait(SIGNAL_TASK),
     lambda r: moves.wake_step(r, "w", fx("w"), None, NOW),
     [(E.SIGNAL_TIMED_OUT, "w", None, None, None, None, None)]),
    ("child started", saga(step(CM, "a")),
     lambda r: moves.append_steps(r, [intent("c", task=CHILD_TASK, state=moves.StepState.WAITING,
                                              kwargs={"saga_id": "kid-1"})], NOW),
     [(E.CHILD_STARTED, "c", None, None, None, "kid-1", None)]),
    ("child ended", _wait(CHILD_TASK, kwargs={"saga_id": "kid-1"}),
     lambda r: moves.child_settled(r, "w", "kid-1", moves.StepState.COMMITTED, {}, NOW),
     [(E.CHILD_ENDED, "w", None, "committed", None, "kid-1", None)]),
    ("approval requested", saga(step(CM, "a")),
     lambda r: moves.append_steps(r, [step("awaiting-approval", "g", task=APPROVAL_TASK)], NOW),
     [(E.APPROVAL_REQUESTED, "g", None, None, None, "ap-g", None)]),
    ("approval denied", _gate(),
     lambda r: moves.fail_gate(r, "g", "ap-g", codes.APPROVAL_DENIED, NOW),
     [(E.APPROVAL_DECIDED, "g", None, "failed", codes.APPROVAL_DENIED, "ap-g", None),
      (E.STATE, None, None, "compensating", codes.APPROVAL_DENIED, None, None)]),
    ("resume with a fresh compensation budget",
     saga(step(CF), state=SagaState.MANUAL_REVIEW, rolling_back=True,
          error_code=codes.COMPENSATION_EXHAUSTED, reason="exhausted"),
     lambda r: moves.resume(r, NOW),
     [(E.STATE, None, None, "compensating", codes.CANCELLED, None, None)]),
]


@pytest.mark.parametrize(("before", "move", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_move_appends_the_entries_of_what_it_changed(
    before: SagaRecord, move: Move, expected: list[tuple[Any, ...]]
) -> None:
    # when
    after = recorded(before, move(before))

    # then
    got = [(e.event, e.step, e.attempt, e.state, e.code, e.ref, e.due_ms) for e in after.history]
    assert got == expected
    assert all(e.at_ms == after.updated_at_ms for e in after.history)


def test_a_write_that_changes_nothing_appends_nothing() -> None:
    record = saga(step(CM))
    assert recorded(record, replace(record, version=record.version + 1)).history == ()


def test_the_creation_is_the_first_entry_and_names_the_parent() -> None:
    child = replace(saga(intent("a")), parent=ParentRef("mom", "c"))
    created = recorded(None, child)
    assert [(e.event, e.step, e.ref) for e in created.history] == [
        (E.CREATED, None, "mom"), (E.INTENT, "a", None)]


def test_the_history_is_taken_from_before_never_from_what_the_write_carries() -> None:
    # given: a write whose record claims another history
    first = HistoryEntry(1, E.CREATED)
    before = replace(saga(step(X1)), history=(first,))
    forged = replace(moves.commit_step(before, _ref(before), {}, NOW), history=())

    # when
    after = recorded(before, forged)

    # then
    assert after.history[0] == first
    assert [e.event for e in after.history] == [E.CREATED, E.COMMITTED]


def test_an_operator_action_comes_before_the_transitions_it_caused() -> None:
    before = saga(step(AM), state=SagaState.MANUAL_REVIEW, error_code=codes.AMBIGUOUS_STEP,
                  reason="step 's' is ambiguous")
    action = OperatorAction(E.RESOLVE, "alice", "checked", step="s", state="committed")

    resolved = recorded(before, moves.commit_step(before, _ref(before), {}, NOW), action=action)

    assert [(e.event, e.step, e.actor, e.reason) for e in resolved.history] == [
        (E.RESOLVE, "s", "alice", "checked"), (E.COMMITTED, "s", None, None),
        (E.STATE, None, None, None)]


def test_past_the_bound_the_oldest_entries_fold_into_a_count() -> None:
    entries = tuple(HistoryEntry(i, E.RESENT, "s") for i in range(7))
    record = replace(saga(step(CM)), history=entries, history_folded=3)

    folded = bounded(record, 5)

    assert folded.history == entries[2:]
    assert folded.history_folded == 5
    assert bounded(folded, 5) is folded


def test_a_claim_note_and_a_signal_note_are_recorded_at_their_own_time() -> None:
    record = saga(step(X0), version=7)
    claim = ClaimNote("s", fx("s"), "w-9", NOW - 50)
    signal = SignalNote("sig-2", "paid", {"payload": 1}, NOW - 20, "bob", "manual payment")

    applied = apply_notes(record, [claim, signal])

    assert [(e.event, e.at_ms, e.ref, e.actor, e.reason) for e in applied.history] == [
        (E.CLAIMED, NOW - 50, "w-9", None, None),
        (E.SIGNAL, NOW - 20, "sig-2", "bob", "manual payment"),
    ]
    assert applied.version == 7


def test_a_withdrawal_note_takes_back_its_claim_wherever_the_claim_is() -> None:
    # given: a claim, as a note before its withdrawal, or already written into the body
    unclaimed = saga(step(X0), version=7)
    claim = ClaimNote("s", fx("s"), "w-9", NOW - 50)
    in_body = apply_notes(unclaimed, [claim])

    # when
    from_notes = apply_notes(unclaimed, [claim, claim.withdrawn()])
    from_body = apply_notes(in_body, [claim.withdrawn()])

    # then: the step is as before the claim, its history saying so
    for applied in (from_notes, from_body):
        taken = applied.step("s")
        assert taken is not None
        assert (taken.attempts, taken.started_at_ms, taken.claimed_by) == (0, None, None)
        assert [e.event for e in applied.history][-1] is E.CLAIM_WITHDRAWN


@pytest.mark.parametrize("variant, claimer, compensation", [
    (X1, "w-9", False),  # another claimer holds the step
    (X0, "worker-1", False),  # nothing claimed
    (CM, "worker-1", False),  # the step moved on
    (P1, "worker-1", True),  # another claimer of the compensation
])
def test_a_withdrawal_note_of_a_claim_that_no_longer_holds_changes_nothing(
        variant: str, claimer: str, compensation: bool) -> None:
    record = saga(step(variant), version=7)
    withdrawal = ClaimNote("s", cx("s") if compensation else fx("s"), claimer, NOW).withdrawn()

    applied = apply_notes(record, [withdrawal])

    assert applied == record


def test_a_withdrawal_note_takes_back_a_compensation_claim() -> None:
    record = saga(step(P1), state=SagaState.COMPENSATING, version=7)

    applied = apply_notes(record, [ClaimNote("s", cx("s"), "worker-2", NOW).withdrawn()])

    taken = applied.step("s")
    assert taken is not None
    assert (taken.compensation_attempts, taken.started_at_ms, taken.claimed_by) == (1, None, None)


def test_a_repeated_signal_appends_nothing() -> None:
    record = saga(step(X0))
    note = SignalNote("sig-2", "paid", {"payload": 1}, NOW)
    once = apply_notes(record, [note])
    assert apply_notes(once, [note]).history == once.history


@pytest.mark.parametrize("variant", [AM, CF])
def test_a_step_state_without_a_name_of_its_own_is_a_generic_step_entry(variant: str) -> None:
    # given: a transition the table does not name (an operator moving a step back to executing)
    before = saga(step(variant))
    after = replace(before, steps=(replace(before.steps[0], state=moves.StepState.EXECUTING),),
                    updated_at_ms=NOW)

    # when
    entries = recorded(before, after).history

    # then
    assert [(e.event, e.state) for e in entries] == [(E.STEP, "executing")]


def test_signals_dropped_as_the_saga_turns_back_are_counted() -> None:
    # given: a running saga holding two signals no wait consumed
    signals = tuple(SignalRecord(f"sig-{i}", "paid", None, NOW - 10) for i in range(2))
    before = replace(saga(step(CM)), signals=signals)

    # when
    after = recorded(before, moves.cancel(before, NOW))

    # then
    dropped = [e for e in after.history if e.event is E.SIGNALS_DROPPED]
    assert [e.attempt for e in dropped] == [after.signals_dropped - before.signals_dropped]
    assert after.signals_dropped - before.signals_dropped == 2
