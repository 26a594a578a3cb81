"""Choosing the next action: in-flight judgement and ``decide`` with stub replays."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.decide import decide, judge_in_flight
from celery_sagas._protocol.decisions import (
    Abandon,
    Append,
    BeginCompensation,
    Complete,
    Decision,
    FinishCompensation,
    Redispatch,
    Review,
    SagaPolicy,
    StartCompensation,
    StepPolicy,
    Vanished,
    Wait,
)
from celery_sagas._protocol.replay import Crashed, Diverged, Outcome, Refused, Returned, Suspended
from celery_sagas._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState

from .protocol_builders import (
    AM,
    AW,
    CD,
    CM,
    FL,
    NOW,
    P0,
    P1,
    PA,
    T0,
    X0,
    X1,
    XR,
    apply_decision,
    cx,
    frozen_copy,
    fx,
    intent,
    saga,
    step,
)

STALE = 30_000
GRACE = 5_000
LIMIT = 60_000
POLICY = SagaPolicy(
    max_compensation_attempts=3,
    stale_ms=STALE,
    grace_ms=GRACE,
    default_time_limit_ms=LIMIT,
    steps={"task.idem": StepPolicy(idempotent=True, attempts_per_effect=3)},
    compensators_idempotent=frozenset({"undo.idem"}),
)
SENT = T0
STARTED = T0 + 10  # step(X1) and step(P1) claim at T0 + 10 and T0 + 40
DEADLINE = STARTED + LIMIT + GRACE


def judge(s: StepRecord, now: int, dead: frozenset[str] = frozenset(), *, back: bool = False) -> Decision:
    """judge_in_flight under the test policy."""
    return judge_in_flight(s, now, POLICY, dead, rolling_back=back)


# ---------------------------------------------------------------- judge_in_flight


def test_unclaimed_and_fresh_waits_until_it_turns_stale() -> None:
    assert judge(step(X0), SENT) == Wait(SENT + STALE)
    assert judge(step(X0), SENT + STALE - 1) == Wait(SENT + STALE)


def test_unclaimed_and_stale_is_redispatched_under_the_same_effect_id() -> None:
    s = step(X0)
    assert judge(s, SENT + STALE) == Redispatch(s, compensation=False)
    never_sent = intent("s", dispatched_at_ms=None)
    assert judge(never_sent, SENT) == Redispatch(never_sent, compensation=False)


def test_a_retry_not_yet_due_waits_for_its_time() -> None:
    released = step(XR)
    due = released.next_attempt_at_ms
    assert due is not None
    assert judge(released, due - 1) == Wait(due)


def test_a_due_retry_is_redispatched() -> None:
    released = step(XR)
    due = released.next_attempt_at_ms
    assert due is not None
    assert judge(released, due) == Redispatch(released, compensation=False)


def test_a_due_retry_already_sent_again_waits_for_staleness() -> None:
    sent = step(XR, dispatched_at_ms=NOW, next_attempt_at_ms=NOW - 1)
    assert judge(sent, NOW + 1) == Wait(NOW + STALE)


def test_claimed_within_its_time_limit_waits_for_the_deadline() -> None:
    assert judge(step(X1), STARTED) == Wait(DEADLINE)
    assert judge(step(X1), DEADLINE - 1) == Wait(DEADLINE)


def test_the_step_time_limit_overrides_the_default() -> None:
    short = step(X1, time_limit_ms=1_000)
    assert judge(short, STARTED) == Wait(STARTED + 1_000 + GRACE)
    assert isinstance(judge(short, STARTED + 1_000 + GRACE), Vanished)


def test_claimed_past_limit_and_grace_vanished_by_time_limit() -> None:
    s = step(X1)
    assert judge(s, DEADLINE) == Vanished(s, compensation=False, retry=False,
                                          error_code=codes.TIME_LIMIT)


def test_claimed_by_a_dead_worker_vanished_at_once() -> None:
    s = step(X1)
    assert judge(s, STARTED + 1, frozenset({fx("s")})) == Vanished(
        s, compensation=False, retry=False, error_code=codes.WORKER_LOST)


def test_a_dead_compensation_id_does_not_condemn_the_execution() -> None:
    assert judge(step(X1), STARTED + 1, frozenset({cx("s")})) == Wait(DEADLINE)


def test_an_idempotent_step_with_attempts_left_is_retried() -> None:
    s = step(X1, task="task.idem")
    verdict = judge(s, DEADLINE)
    assert isinstance(verdict, Vanished) and verdict.retry and not verdict.compensation


def test_an_idempotent_step_out_of_attempts_is_ambiguous() -> None:
    s = step(X1, task="task.idem", attempts=3)
    verdict = judge(s, DEADLINE, frozenset({fx("s")}))
    assert isinstance(verdict, Vanished) and not verdict.retry
    assert verdict.error_code == codes.WORKER_LOST


def test_an_idempotent_step_is_not_retried_while_rolling_back() -> None:
    verdict = judge(step(X1, task="task.idem"), DEADLINE, back=True)
    assert isinstance(verdict, Vanished) and not verdict.retry


def test_unclaimed_compensator_is_redispatched_when_stale() -> None:
    s = step(P0)
    sent = s.dispatched_at_ms
    assert sent is not None
    assert judge(s, sent + 1) == Wait(sent + STALE)
    assert judge(s, sent + STALE) == Redispatch(s, compensation=True)


def test_a_claimed_compensator_is_judged_by_its_own_time_limit_not_its_steps() -> None:
    s = replace(step(P1), time_limit_ms=1_000)  # the step's own limit: not the compensator's
    started = s.started_at_ms
    assert started is not None and s.compensator is not None
    policy = replace(POLICY, compensator_time_limits={s.compensator: 3 * LIMIT})
    assert judge_in_flight(s, started + LIMIT + GRACE, policy) == Wait(started + 3 * LIMIT + GRACE)
    # a compensator the policy does not know gets the default limit, still not the step's
    assert judge(s, started + 1_000 + GRACE) == Wait(started + LIMIT + GRACE)


def test_claimed_compensator_judged_like_a_step() -> None:
    s = step(P1)
    started = s.started_at_ms
    assert started is not None
    assert judge(s, started) == Wait(started + LIMIT + GRACE)
    assert judge(s, started + LIMIT + GRACE) == Vanished(
        s, compensation=True, retry=False, error_code=codes.TIME_LIMIT)
    assert judge(s, started + 1, frozenset({cx("s")})) == Vanished(
        s, compensation=True, retry=False, error_code=codes.WORKER_LOST)


def test_an_idempotent_compensator_is_retried() -> None:
    s = step(P1, compensator="undo.idem")
    verdict = judge(s, NOW, frozenset({cx("s")}))
    assert isinstance(verdict, Vanished) and verdict.retry and verdict.compensation


# ---------------------------------------------------------------- decide


def stub(outcome: Outcome) -> tuple[Callable[[], Outcome], list[int]]:
    """A replay callable returning ``outcome`` and the list its calls are counted in."""
    calls: list[int] = []

    def replay() -> Outcome:
        calls.append(1)
        return outcome

    return replay, calls


def never() -> Outcome:
    """A replay that must not be called."""
    raise AssertionError("replay must not run here")


@pytest.mark.parametrize("state", [SagaState.MANUAL_REVIEW, SagaState.COMPLETED, SagaState.COMPENSATED])
def test_sagas_not_live_wait_without_replaying(state: SagaState) -> None:
    assert decide(saga(step(X0), state=state), never, NOW, POLICY) == Wait()


def test_returned_completes_with_what_run_returned() -> None:
    replay, calls = stub(Returned("done"))
    assert decide(saga(step(CM, "a")), replay, NOW, POLICY) == Complete(result="done")
    assert calls == [1]


def test_suspended_with_new_steps_appends_them() -> None:
    new = (intent("b"), intent("c"))
    replay, _ = stub(Suspended(new))
    assert decide(saga(step(CM, "a")), replay, NOW, POLICY) == Append(new)


def test_suspended_on_a_step_in_flight_waits_for_it() -> None:
    replay, _ = stub(Suspended())
    assert decide(saga(step(CM, "a"), step(X1, "b")), replay, NOW, POLICY) == Wait(DEADLINE)


def test_suspended_with_nothing_in_flight_waits_for_a_report() -> None:
    replay, _ = stub(Suspended())
    gated = intent("b", state=StepState.AWAITING_APPROVAL)
    assert decide(saga(step(CM, "a"), gated), replay, NOW, POLICY) == Wait()


def test_diverged_goes_to_review_as_nondeterministic() -> None:
    replay, _ = stub(Diverged("asked for 'x' instead of 'a'"))
    assert decide(saga(step(CM, "a")), replay, NOW, POLICY) == Review(
        codes.NONDETERMINISTIC, "asked for 'x' instead of 'a'")


def test_crashed_goes_to_review_with_its_code() -> None:
    replay, _ = stub(Crashed(codes.RUN_FAILED, "run() raised KeyError"))
    assert decide(saga(step(CM, "a")), replay, NOW, POLICY) == Review(
        codes.RUN_FAILED, "run() raised KeyError")


def test_refused_starts_compensation() -> None:
    replay, _ = stub(Refused("out_of_stock", "run() refused"))
    assert decide(saga(step(CM, "a")), replay, NOW, POLICY) == StartCompensation(
        "out_of_stock", "run() refused")


def test_a_stale_unclaimed_step_is_redispatched_before_replaying() -> None:
    record = saga(step(CM, "a"), step(X0, "b"))
    s = record.steps[1]
    decision = decide(record, never, SENT + STALE, POLICY)
    assert decision == Redispatch(s, compensation=False)


def test_a_vanished_step_is_judged_before_replaying() -> None:
    record = saga(step(CM, "a"), step(X1, "b"))
    s = record.steps[1]
    decision = decide(record, never, DEADLINE, POLICY)
    assert decision == Vanished(s, compensation=False, retry=False, error_code=codes.TIME_LIMIT)


def test_dead_effects_reach_the_judgement() -> None:
    record = saga(step(X1, "b"))
    s = record.steps[0]
    decision = decide(record, never, STARTED + 1, POLICY, frozenset({fx("b")}))
    assert decision == Vanished(s, compensation=False, retry=False, error_code=codes.WORKER_LOST)


def test_the_earliest_wait_is_returned_when_several_steps_are_in_flight() -> None:
    replay, _ = stub(Suspended())
    record = saga(step(X1, "a", started_at_ms=T0 + 500), step(X1, "b", started_at_ms=T0 + 100))
    assert decide(record, replay, T0 + 600, POLICY) == Wait(T0 + 100 + LIMIT + GRACE)


def test_an_unresolved_ambiguity_waits_without_replaying() -> None:
    record = saga(step(AM, "a"), step(X1, "b"))
    assert decide(record, never, NOW, POLICY) == Wait(DEADLINE)


def test_no_replay_callable_means_wait() -> None:
    assert decide(saga(step(CM, "a")), None, NOW, POLICY) == Wait()


def test_refused_wins_over_steps_in_flight() -> None:
    replay, _ = stub(Refused("out_of_stock", "x"))
    decision = decide(saga(step(X1, "a")), replay, NOW, POLICY)
    assert decision == StartCompensation("out_of_stock", "x")


def test_decide_leaves_the_saga_alone() -> None:
    record = saga(step(CM, "a"), step(X0, "b"))
    before = frozen_copy(record)
    decide(record, stub(Suspended())[0], SENT + STALE, POLICY)
    assert record == before


# ---------------------------------------------------------------- decide while compensating


def back(*steps: StepRecord) -> SagaRecord:
    """A cancelled saga rolling back over ``steps``."""
    return saga(*steps, state=SagaState.COMPENSATING, error_code=codes.CANCELLED, reason="cancelled")


def test_compensating_never_replays_and_plans_the_next_compensation() -> None:
    record = back(step(CM, "a"), step(FL, "b"))
    decision = decide(record, never, NOW, POLICY)
    assert isinstance(decision, BeginCompensation) and decision.step.name == "a"


def test_compensating_abandons_an_unclaimed_intent_first() -> None:
    record = back(step(CM, "a"), step(X0, "b"))
    assert decide(record, never, NOW, POLICY) == Abandon(record.steps[1])


def test_compensating_judges_a_step_released_for_a_retry_ambiguous() -> None:
    # its last attempt began and may have committed; no retry is claimed while rolling back
    record = back(step(CM, "a"), step(XR, "b"))
    s = record.steps[1]
    decision = decide(record, never, NOW, POLICY)
    assert decision == Vanished(s, compensation=False, retry=False, error_code=codes.TIME_LIMIT)


def test_compensating_fails_a_step_released_by_retry_on_as_nothing_committed() -> None:
    # a step that is not idempotent is released only after a retry_on failure
    record = back(step(CM, "a"), step(XR, "b", error_code="rate_limited"))
    policy = replace(POLICY, steps={"task.b": StepPolicy(retry_on=True)})
    decision = decide(record, never, NOW, policy)
    assert decision == Abandon(record.steps[1], nothing_committed=True)
    # an idempotent one's release may follow an unknown outcome: still ambiguous
    both = replace(POLICY, steps={"task.b": StepPolicy(idempotent=True, retry_on=True)})
    assert isinstance(decide(record, never, NOW, both), Vanished)


def test_compensating_waits_for_a_claimed_step_to_report() -> None:
    assert decide(back(step(CM, "a"), step(X1, "b")), never, NOW, POLICY) == Wait(DEADLINE)


def test_compensating_waits_for_a_running_compensator() -> None:
    p = step(P1, "a")
    assert p.started_at_ms is not None
    assert decide(back(p), never, NOW, POLICY) == Wait(p.started_at_ms + LIMIT + GRACE)


def test_compensating_redispatches_a_stale_compensator() -> None:
    record = back(step(P0, "a"))
    p = record.steps[0]
    assert p.dispatched_at_ms is not None
    assert decide(record, never, p.dispatched_at_ms + STALE, POLICY) == Redispatch(p, compensation=True)


def test_compensating_with_a_retry_not_due_waits_for_it() -> None:
    record = back(step(CD, "a"), step("compensation-failed", "b", next_attempt_at_ms=NOW + 7))
    assert decide(record, never, NOW, POLICY) == Wait(NOW + 7)


def test_compensating_finishes_when_nothing_is_left() -> None:
    assert decide(back(step(CD, "a"), step(FL, "b")), never, NOW, POLICY) == FinishCompensation()


def test_compensating_with_exhausted_attempts_goes_to_review() -> None:
    record = back(step("compensation-failed", "a", compensation_attempts=3, next_attempt_at_ms=NOW))
    decision = decide(record, never, NOW, POLICY)
    assert isinstance(decision, Review) and decision.error_code == codes.COMPENSATION_EXHAUSTED


def test_an_ambiguous_compensation_is_not_judged_as_in_flight() -> None:
    record = back(step(PA, "a"))
    decision = decide(record, never, NOW + 10 * LIMIT, POLICY, frozenset({cx("a")}))
    assert isinstance(decision, Review)


# ---------------------------------------------------------------- decisions are carried out


def drive(record: SagaRecord, replay: Callable[[], Outcome] | None, now: int, limit: int = 20) -> SagaRecord:
    """Apply decisions (stepping the clock) until decide says Wait."""
    for i in range(limit):
        decision = decide(record, replay, now + i, POLICY)
        if isinstance(decision, Wait):
            return record
        record = apply_decision(record, decision, now + i)
    raise AssertionError("decide never settled")


def test_a_cancelled_saga_with_an_unclaimed_intent_reaches_compensated_once_undone() -> None:
    record = moves.cancel(saga(step(CM, "a"), step(X0, "b")), NOW)
    record = drive(record, never, NOW)
    assert record.state is SagaState.COMPENSATING
    assert record.steps[0].state is StepState.COMPENSATING
    record = moves.claim_compensation(record, "a", cx("a"), "w", NOW + 100)
    record = moves.compensation_succeeded(record, AttemptRef("a", cx("a"), 1), NOW + 101)
    record = drive(record, never, NOW + 102)
    assert record.state is SagaState.COMPENSATED
    assert record.steps[1].error_code == codes.NOT_STARTED


def test_compensating_abandons_a_step_awaiting_approval() -> None:
    gated = step(AW, "b")
    assert decide(back(step(CM, "a"), gated), never, NOW, POLICY) == Abandon(gated)


def test_a_cancelled_saga_with_a_step_awaiting_approval_reaches_compensated() -> None:
    record = moves.cancel(saga(step(CD, "a"), step(AW, "b")), NOW)
    record = drive(record, never, NOW)
    assert record.state is SagaState.COMPENSATED
    assert record.steps[1].state is StepState.FAILED


def test_decisions_on_a_forward_run_are_applicable() -> None:
    record = saga(version=1)
    decision = decide(record, stub(Suspended((intent("a"),)))[0], NOW, POLICY)
    record = apply_decision(record, decision, NOW)
    assert [s.name for s in record.steps] == ["a"]
    record = moves.claim_step(record, "a", fx("a"), "w", NOW + 5)
    record = moves.commit_step(record, AttemptRef("a", fx("a"), 1), {"ok": True}, NOW + 6)
    record = drive(record, stub(Returned())[0], NOW + 7)
    assert record.state is SagaState.COMPLETED


def test_decided_review_lands_in_manual_review() -> None:
    record = drive(saga(step(CM, "a")), stub(Diverged("x"))[0], NOW)
    assert record.state is SagaState.MANUAL_REVIEW
    assert record.error_code == codes.NONDETERMINISTIC
