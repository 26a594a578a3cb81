"""Waiting steps, signals, patches and child sagas in the pure protocol (docs/design.md
§3.4-3.7): the wake decision, the wake move over every saga and step state, signal notes, due
times, replay, and how a child's end moves its parent."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas import SignalTimeout
from celery_sagas._codec import Codec
from celery_sagas._context import SagaContext, replay
from celery_sagas._definitions import Registry, SagaDefinition
from celery_sagas._protocol import moves
from celery_sagas._protocol.children import child_saga_id, settle
from celery_sagas._protocol.decide import decide
from celery_sagas._protocol.decisions import Abandon, Append, Complete, SagaPolicy, Wait, Wake
from celery_sagas._protocol.due import due_at
from celery_sagas._protocol.findings import saga_finding
from celery_sagas._protocol.kinds import CHILD_TASK, CHILD_UNDO, SIGNAL_TASK, TIMER_TASK
from celery_sagas._protocol.notes import SignalNote, apply_notes, parse_note
from celery_sagas._protocol.replay import Recorded, Returned, StepCall, Suspended, match_call
from celery_sagas._protocol.waiting import TIMED_OUT, judge_waiting, timed_out
from celery_sagas._records import (
    ParentRef,
    SagaRecord,
    SagaState,
    SignalRecord,
    StepRecord,
    StepState,
)
from celery_sagas.errors import IllegalTransition, StepNotCommitted
from tests.unit.protocol_builders import NOW, T0, VARIANTS, saga, step

CM_ = "committed"
POLICY = SagaPolicy(max_compensation_attempts=3, stale_ms=30_000, grace_ms=30_000,
                    default_time_limit_ms=300_000)


def timer(name: str = "sleep", wake: int = NOW + 500) -> StepRecord:
    """A waiting timer step."""
    return StepRecord(name, TIMER_TASK, f"fx-{name}", f"cx-{name}", StepState.WAITING,
                      kwargs={"seconds": 1}, wake_at_ms=wake)


def wait(name: str = "signal:paid", signal: str = "paid", wake: int | None = None) -> StepRecord:
    """A waiting signal step."""
    return StepRecord(name, SIGNAL_TASK, f"fx-{name}", f"cx-{name}", StepState.WAITING,
                      kwargs={"signal": signal, "timeout": None}, wake_at_ms=wake)


def sent(signal_id: str, name: str = "paid", payload: Any = None,
         consumed_by: str | None = None) -> SignalRecord:
    """A recorded signal."""
    return SignalRecord(signal_id, name, payload, T0, consumed_by)


# ---------------------------------------------------------------- judging a waiting step


@pytest.mark.parametrize(("now", "expected"), [
    (NOW + 499, Wait(NOW + 500)),
    (NOW + 500, "wake"),
    (NOW + 10_000, "wake"),
])
def test_a_timer_wakes_exactly_at_its_wake_up(now: int, expected: Any) -> None:
    step_ = timer()
    verdict = judge_waiting(saga(step(CM_, "a"), step_), step_, now)
    assert verdict == (Wake(step_, None) if expected == "wake" else expected)


@pytest.mark.parametrize(("signals", "now", "expected"), [
    ((), NOW, Wait(None)),
    ((sent("s1", "other"),), NOW, Wait(None)),
    ((sent("s1", consumed_by="older"),), NOW, Wait(None)),
    ((sent("s1", payload=1),), NOW, Wake(wait(), {"signal_id": "s1", "payload": 1}, "s1")),
    ((sent("s0", consumed_by="older"), sent("s1", payload=2), sent("s2", payload=3)), NOW,
     Wake(wait(), {"signal_id": "s1", "payload": 2}, "s1")),
])
def test_a_signal_wait_takes_the_first_unconsumed_signal_of_its_name(
        signals: tuple[SignalRecord, ...], now: int, expected: Any) -> None:
    record = replace(saga(wait()), signals=signals)
    assert judge_waiting(record, wait(), now) == expected


@pytest.mark.parametrize(("signals", "now", "expected"), [
    ((), NOW + 999, Wait(NOW + 1_000)),
    ((), NOW + 1_000, "timeout"),
    ((sent("s1", payload=1),), NOW + 5_000, "signal"),  # a signal there beats the timeout
])
def test_a_signal_wait_times_out_at_its_wake_up(signals: tuple[SignalRecord, ...], now: int,
                                                expected: Any) -> None:
    waiting = wait(wake=NOW + 1_000)
    verdict = judge_waiting(replace(saga(waiting), signals=signals), waiting, now)
    if expected == "timeout":
        assert verdict == Wake(waiting, TIMED_OUT)
    elif expected == "signal":
        assert isinstance(verdict, Wake) and verdict.signal_id == "s1"
    else:
        assert verdict == expected


def test_only_the_timeout_marker_counts_as_timed_out() -> None:
    assert timed_out({"timeout": True})
    assert not timed_out({"signal_id": "s", "payload": {"timeout": True}})
    assert not timed_out(None)


# ---------------------------------------------------------------- decide


def test_decide_wakes_a_due_timer_before_replaying() -> None:
    record = saga(step(CM_, "a"), timer(wake=NOW))
    assert decide(record, None, NOW, POLICY) == Wake(record.steps[1], None)


def test_decide_waits_for_a_timer_until_its_wake_up() -> None:
    record = saga(step(CM_, "a"), timer(wake=NOW + 7))
    assert decide(record, lambda: Suspended(), NOW, POLICY) == Wait(NOW + 7)


@pytest.mark.parametrize("waiting", [timer(), wait()])
def test_a_saga_rolling_back_abandons_its_waiting_step(waiting: StepRecord) -> None:
    record = saga(step(CM_, "a"), waiting, state=SagaState.COMPENSATING)
    assert decide(record, None, NOW, POLICY) == Abandon(record.steps[1])


def test_append_and_complete_carry_the_patches_the_replay_passed() -> None:
    new = step("executing-unclaimed", "b")
    record = saga(step(CM_, "a"))
    assert decide(record, lambda: Suspended((new,), ("p1",)), NOW, POLICY) == Append((new,), ("p1",))
    assert decide(record, lambda: Returned(1, ("p2",)), NOW, POLICY) == Complete(("p2",), 1)


# ---------------------------------------------------------------- the wake move


SAGA_STATES = list(SagaState)


@pytest.mark.parametrize("saga_state", SAGA_STATES)
@pytest.mark.parametrize("variant", [*VARIANTS, "waiting"])
def test_wake_step_is_legal_only_for_a_waiting_step_of_a_running_saga(
        saga_state: SagaState, variant: str) -> None:
    # given
    target = timer("t") if variant == "waiting" else step(variant, "t")
    record = saga(step(CM_, "a"), target, state=saga_state,
                  rolling_back=saga_state is SagaState.COMPENSATING)
    frozen = replace(record)

    # when / then
    if variant == "waiting" and saga_state is SagaState.RUNNING:
        woken = moves.wake_step(record, "t", "fx-t", None, NOW)
        assert woken.version == record.version + 1
        assert woken.steps[1].state is StepState.COMMITTED
        assert woken.steps[1].committed_at_ms is not None
    else:
        with pytest.raises(IllegalTransition):
            moves.wake_step(record, "t", "fx-t", None, NOW)
    assert record == frozen


def test_wake_step_marks_the_received_signal_consumed_in_the_same_write() -> None:
    record = replace(saga(wait()), signals=(sent("s1", payload=1), sent("s2", payload=2)))
    woken = moves.wake_step(record, "signal:paid", "fx-signal:paid",
                            {"signal_id": "s1", "payload": 1}, NOW, "s1")
    assert [s.consumed_by for s in woken.signals] == ["signal:paid", None]
    assert woken.steps[0].result == {"signal_id": "s1", "payload": 1}


@pytest.mark.parametrize("signals", [(), (sent("s1", consumed_by="x"),)])
def test_wake_step_refuses_a_signal_not_there_or_consumed(signals: tuple[SignalRecord, ...]) -> None:
    record = replace(saga(wait()), signals=signals)
    with pytest.raises(IllegalTransition):
        moves.wake_step(record, "signal:paid", "fx-signal:paid", None, NOW, "s1")


def test_wake_step_refuses_another_effect_id() -> None:
    with pytest.raises(IllegalTransition):
        moves.wake_step(saga(timer()), "sleep", "fx-other", None, NOW)


def test_a_waiting_step_is_abandoned_when_rolling_back() -> None:
    record = saga(step(CM_, "a"), timer("t"), state=SagaState.COMPENSATING)
    after = moves.abandon_step(record, "t", "fx-t", NOW)
    assert (after.steps[1].state, after.steps[1].error_code) == (StepState.FAILED, "not_started")


def test_patches_are_recorded_once_in_order() -> None:
    record = replace(saga(), patches=("p1",))
    after = moves.append_steps(record, [step("executing-unclaimed", "b")], NOW, ("p2", "p1", "p2"))
    assert after.patches == ("p1", "p2")


# ---------------------------------------------------------------- due times and findings


def test_a_waiting_step_makes_the_saga_due_at_its_wake_up() -> None:
    assert due_at(saga(step(CM_, "a"), timer(wake=NOW + 9))) == NOW + 9
    assert due_at(saga(wait(wake=None))) is None
    assert due_at(saga(timer(wake=NOW + 9), state=SagaState.MANUAL_REVIEW)) is None


def test_a_waiting_saga_is_no_stale_finding_until_its_wake_up_is_past_stale_after() -> None:
    waiting = saga(step(CM_, "a"), timer())
    wake = waiting.steps[-1].wake_at_ms
    assert wake is not None
    assert saga_finding(waiting, stale_before_ms=wake) is None
    overdue = saga_finding(waiting, stale_before_ms=wake + 1)  # beat has not run the sweep
    assert overdue is not None and str(overdue.kind) == "stale"


# ---------------------------------------------------------------- signal notes


def test_a_signal_note_round_trips_and_a_repeated_id_is_one_signal() -> None:
    note = SignalNote("s1", "paid", {"payload": {"amount": 1}}, T0)
    again = SignalNote("s1", "paid", {"payload": {"amount": 2}}, T0 + 1)
    assert parse_note(note.text()) == note
    applied = apply_notes(saga(), [parse_note(note.text()), parse_note(again.text())])
    assert applied.signals == (SignalRecord("s1", "paid", {"amount": 1}, T0),)


@pytest.mark.parametrize("raw", [
    {"signal": ["s1", "paid", {"payload": 1}]},
    {"signal": ["has space", "paid", {"payload": 1}, T0]},
    {"signal": ["s1", "paid", {"payload": 1}, -1]},
    {"signal": ["s1", "paid", 1, T0]},
    {"signal": ["s1", "paid", {"payload": 1, "sealed": "x"}, T0]},
    {"signal": ["s1", "paid", {"other": 1}, T0]},
    {"signal": "s1"},
    {"signal": ["s1", "paid", {"payload": 1}, T0], "claim": []},
])
def test_a_malformed_signal_note_is_refused(raw: Any) -> None:
    with pytest.raises(ValueError):
        parse_note(json.dumps(raw))


def test_a_sealed_signal_note_is_opened_by_the_opener_it_is_applied_with() -> None:
    note = parse_note(SignalNote("s1", "paid", {"sealed": "token"}, T0).text())
    with pytest.raises(ValueError):
        apply_notes(saga(), [note])  # a codec without keys cannot open it
    applied = apply_notes(saga(), [note], lambda stored: f"opened {stored['sealed']}")
    assert applied.signals[0].payload == "opened token"


def test_signals_patches_and_wake_ups_survive_the_codec() -> None:
    codec = Codec()
    record = replace(saga(step(CM_, "a"), timer(wake=NOW + 9)), patches=("p1",),
                     signals=(sent("s1", payload={"x": 1}, consumed_by="w"), sent("s2")))
    envelope = codec.saga_envelope(record)
    assert codec.saga(envelope, record.saga_id) == record
    assert envelope.due_at_ms == NOW + 9


def test_a_record_without_signals_or_patches_keeps_its_body() -> None:
    body = json.loads(Codec().saga_envelope(saga(step(CM_, "a"))).body)
    assert "signals" not in body and "patches" not in body


# ---------------------------------------------------------------- replay


def test_a_timer_matches_its_record_whatever_wake_up_run_asks_for_now() -> None:
    record = saga(timer(wake=NOW))
    call = StepCall("sleep", TIMER_TASK, (), {"until_ms": NOW + 123}, None)
    assert match_call(record, 0, call) == Recorded(record.steps[0])


def _replayed(record: SagaRecord, run: Any) -> Any:
    definition = SagaDefinition(record.definition, run)
    return replay(definition, SagaContext(record, Registry(), lambda: "id", NOW))


def test_patched_is_false_behind_recorded_steps_and_true_at_the_frontier() -> None:
    seen: list[bool] = []

    def run(ctx: Any, _: Any) -> None:
        seen.append(ctx.patched("p"))
        ctx.sleep(1)
        seen.append(ctx.patched("q"))
        ctx.sleep(1)

    fired = replace(timer(wake=NOW), state=StepState.COMMITTED, result=None)
    outcome = _replayed(saga(fired), run)
    assert seen == [False, True]
    assert isinstance(outcome, Suspended) and outcome.patches == ("q",)


def test_a_recorded_patch_is_true_anywhere() -> None:
    seen: list[bool] = []

    def run(ctx: Any, _: Any) -> None:
        seen.append(ctx.patched("p"))
        ctx.sleep(1)

    fired = replace(timer(wake=NOW), state=StepState.COMMITTED)
    _replayed(replace(saga(fired), patches=("p",)), run)
    assert seen == [True]


def test_a_committed_timeout_raises_signal_timeout_at_the_call_on_every_replay() -> None:
    caught: list[str] = []

    def run(ctx: Any, _: Any) -> str:
        try:
            ctx.wait_signal("paid", timeout=5)
        except SignalTimeout as exc:
            caught.append(exc.signal)
            return "late"
        return "paid"

    done = replace(wait(), kwargs={"signal": "paid", "timeout": 5}, state=StepState.COMMITTED,
                   result=dict(TIMED_OUT))
    for _ in range(2):
        outcome = _replayed(saga(done), run)
        assert getattr(outcome, "value", None) == "late"
    assert caught == ["paid", "paid"]


# ---------------------------------------------------------------- child sagas


def child_step(name: str = "child:pay", state: StepState = StepState.WAITING, **changes: Any
               ) -> StepRecord:
    """A child step of the parent ``order-42`` naming the child ``order-42/2``."""
    return replace(StepRecord(name, CHILD_TASK, f"fx-{name}", f"cx-{name}", state,
                              kwargs={"definition": "pay", "input": {}, "saga_id": "order-42/2"},
                              compensator=CHILD_UNDO), **changes)


def child(state: SagaState, result: Any = None) -> SagaRecord:
    """The child saga ``order-42/2`` in ``state``."""
    return SagaRecord("order-42/2", "pay", state, {}, T0, T0, result=result,
                      parent=ParentRef("order-42", "child:pay"))


_COMPENSATING_CHILD_STEP = dict(state=StepState.COMPENSATING, compensation_attempts=1,
                                result={"r": 1}, committed_at_ms=T0 + 5, attempts=1)


@pytest.mark.parametrize(("step_state", "child_state", "expected"), [
    (StepState.WAITING, SagaState.RUNNING, None),
    (StepState.WAITING, SagaState.COMPENSATING, None),
    (StepState.WAITING, SagaState.COMPLETED, (StepState.COMMITTED, SagaState.RUNNING)),
    (StepState.WAITING, SagaState.COMPENSATED, (StepState.FAILED, SagaState.COMPENSATING)),
    (StepState.WAITING, SagaState.MANUAL_REVIEW, (StepState.WAITING, SagaState.MANUAL_REVIEW)),
    (StepState.COMPENSATING, SagaState.COMPLETED, None),
    (StepState.COMPENSATING, SagaState.COMPENSATING, None),
    (StepState.COMPENSATING, SagaState.COMPENSATED, (StepState.COMPENSATED, SagaState.COMPENSATING)),
    (StepState.COMPENSATING, SagaState.MANUAL_REVIEW,
     (StepState.COMPENSATING, SagaState.MANUAL_REVIEW)),
    (StepState.COMMITTED, SagaState.COMPLETED, None),
    (StepState.FAILED, SagaState.COMPENSATED, None),
])
def test_settle_moves_the_parent_as_its_child_ended(step_state: StepState, child_state: SagaState,
                                                    expected: Any) -> None:
    # given
    compensating = step_state is StepState.COMPENSATING
    step_ = child_step(**(_COMPENSATING_CHILD_STEP if compensating else {"state": step_state}))
    parent = saga(step(CM_, "a"), step_, state=SagaState.COMPENSATING if compensating
                  else SagaState.RUNNING)

    # when
    after = settle(parent, "child:pay", child(child_state, {"r": 1}), NOW)

    # then
    if expected is None:
        assert after is None
        return
    assert after is not None and after.version == parent.version + 1
    assert (after.steps[1].state, after.state) == expected
    if expected[0] is StepState.COMMITTED:
        assert after.steps[1].result == {"r": 1}
    if after.state is SagaState.MANUAL_REVIEW:
        assert after.error_code == "child_in_review" and "order-42/2" in (after.reason or "")


def test_a_review_naming_the_child_is_lifted_when_the_child_ends() -> None:
    parent = saga(step(CM_, "a"), child_step())
    in_review = settle(parent, "child:pay", child(SagaState.MANUAL_REVIEW), NOW)
    assert in_review is not None and in_review.state is SagaState.MANUAL_REVIEW
    after = settle(in_review, "child:pay", child(SagaState.COMPLETED, 5), NOW + 1)
    assert after is not None and (after.state, after.error_code) == (SagaState.RUNNING, None)


def test_settle_ignores_another_child_and_a_final_parent() -> None:
    parent = saga(step(CM_, "a"), child_step())
    stranger = replace(child(SagaState.COMPLETED), saga_id="someone-else")
    assert settle(parent, "child:pay", stranger, NOW) is None
    assert settle(replace(parent, state=SagaState.COMPENSATED), "child:pay",
                  child(SagaState.COMPLETED), NOW) is None


def test_a_waiting_child_step_is_waited_for_even_while_rolling_back() -> None:
    record = saga(step(CM_, "a"), child_step(), state=SagaState.COMPENSATING)
    assert decide(record, None, NOW, POLICY) == Wait()


@pytest.mark.parametrize(("parent_id", "position", "expected"), [
    ("trip-1", 1, "trip-1/2"),
    ("t" * 118, 0, "t" * 118 + "/1"),
])
def test_a_child_id_derives_from_its_parent_and_position(parent_id: str, position: int,
                                                         expected: str) -> None:
    assert child_saga_id(parent_id, position) == expected


def test_a_child_id_too_long_to_derive_is_hashed_deterministically() -> None:
    first, again = child_saga_id("t" * 128, 3), child_saga_id("t" * 128, 3)
    assert first == again and first.startswith("child-") and len(first) <= 120
    assert child_saga_id("t" * 128, 4) != first


@pytest.mark.parametrize("state", list(SagaState))
def test_only_a_completed_child_reopens(state: SagaState) -> None:
    record = replace(child(state), steps=())
    if state is SagaState.COMPLETED:
        after = moves.reopen(record, NOW)
        assert (after.state, after.rolling_back, after.error_code) == (
            SagaState.COMPENSATING, True, "parent_compensating")
    else:
        with pytest.raises(IllegalTransition):
            moves.reopen(record, NOW)
    with pytest.raises(IllegalTransition):
        moves.reopen(replace(record, parent=None, state=SagaState.COMPLETED), NOW)


def test_a_default_child_id_is_moved_into_its_parent_bucket_the_same_way_every_time() -> None:
    def run(ctx: Any, _: Any) -> Any:
        return ctx.child("pay", {})

    registry = Registry()
    registry.add_definition(SagaDefinition("pay", lambda ctx, data: None))
    definition = SagaDefinition("place-order", run)

    def colocate(candidate: str) -> str:
        return candidate + ".3"

    outcomes = [replay(definition, SagaContext(saga(), registry, lambda: "id", NOW, colocate=colocate))
                for _ in range(2)]
    ids = [o.new_steps[0].kwargs["saga_id"] for o in outcomes if isinstance(o, Suspended)]
    assert ids == ["order-42/1.3", "order-42/1.3"]


@pytest.mark.parametrize("waiting", [timer(), wait()])
def test_a_saga_held_by_a_waiting_step_is_not_replayed(waiting: StepRecord) -> None:
    def never() -> Any:
        raise AssertionError("replayed")

    record = saga(step(CM_, "a"), waiting)
    assert isinstance(decide(record, never, NOW, POLICY), Wait)


def test_signal_timeout_is_a_step_not_committed_that_survives_pickling() -> None:
    error = SignalTimeout(signal="paid")
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, StepNotCommitted) and isinstance(again, SignalTimeout)
    assert (again.signal, again.code, str(again)) == ("paid", "signal_timeout",
                                                      "no signal 'paid' within the timeout")
