"""The compensation planner and retry-policy checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_sagas._protocol import codes
from celery_sagas._protocol.compensation import (
    MAX_BACKOFF_MS,
    check_backoff,
    commit_order,
    default_backoff_ms,
    full_jitter_ms,
    plan_compensation,
)
from celery_sagas._protocol.decisions import BeginCompensation, FinishCompensation, Review, Wait
from celery_sagas._records import SagaState, StepRecord
from celery_sagas._values import MAX_SAFE_INTEGER

from .protocol_builders import AM, CD, CF, CM, FL, NOW, P0, P1, PA, X0, X1, names, saga, step

MAX = 3


def plan(*steps: StepRecord, now: int = NOW, max_attempts: int = MAX) -> object:
    """Plan the next compensation of a compensating saga holding ``steps``."""
    return plan_compensation(saga(*steps, state=SagaState.COMPENSATING), now, max_attempts)


def begins(decision: object) -> str:
    """The name of the step a BeginCompensation decision names."""
    assert isinstance(decision, BeginCompensation), decision
    return decision.step.name


def test_a_due_committed_step_is_compensated() -> None:
    assert begins(plan(step(CM, "a"))) == "a"


def test_a_failed_compensation_whose_retry_is_due_is_compensated_again() -> None:
    assert begins(plan(step(CF, "a", next_attempt_at_ms=NOW))) == "a"
    assert begins(plan(step(CF, "a", next_attempt_at_ms=NOW - 1))) == "a"
    assert begins(plan(step(CF, "a", next_attempt_at_ms=None))) == "a"


def test_a_retry_not_yet_due_waits_until_it_is() -> None:
    assert plan(step(CF, "a", next_attempt_at_ms=NOW + 1)) == Wait(NOW + 1)


def test_a_retry_not_yet_due_stops_the_walk_before_older_steps() -> None:
    decision = plan(step(CM, "a", committed_at=NOW - 500),
                    step(CF, "b", committed_at=NOW - 100, next_attempt_at_ms=NOW + 50))
    assert decision == Wait(NOW + 50)


@pytest.mark.parametrize("attempts", [MAX, MAX + 1])
def test_exhausted_attempts_go_to_review(attempts: int) -> None:
    decision = plan(step(CF, "a", compensation_attempts=attempts, next_attempt_at_ms=NOW - 1))
    assert isinstance(decision, Review)
    assert decision.error_code == codes.COMPENSATION_EXHAUSTED
    assert "'a'" in decision.reason


def test_one_attempt_short_of_the_limit_is_still_tried() -> None:
    assert begins(plan(step(CF, "a", compensation_attempts=MAX - 1, next_attempt_at_ms=NOW))) == "a"


def test_exhaustion_is_reported_at_once_without_waiting_out_the_backoff() -> None:
    exhausted = step(CF, "a", compensation_attempts=MAX, next_attempt_at_ms=NOW + 10)
    assert isinstance(plan(exhausted), Review)
    assert isinstance(plan(exhausted, now=NOW + 10), Review)


def test_newest_commit_is_undone_first() -> None:
    steps = (step(CM, "a", committed_at=NOW - 300), step(CM, "b", committed_at=NOW - 100),
             step(CM, "c", committed_at=NOW - 200))
    assert begins(plan(*steps)) == "b"
    assert names(commit_order(saga(*steps))) == ["b", "c", "a"]


def test_commit_ties_are_broken_by_position_last_first() -> None:
    steps = (step(CM, "a", committed_at=NOW - 100), step(CM, "b", committed_at=NOW - 100),
             step(CM, "c", committed_at=NOW - 300))
    assert begins(plan(*steps)) == "b"
    assert names(commit_order(saga(*steps))) == ["b", "a", "c"]


def test_compensated_and_failed_steps_are_skipped() -> None:
    steps = (step(CM, "a", committed_at=NOW - 300), step(CD, "b", committed_at=NOW - 200),
             step(FL, "c"))
    assert begins(plan(*steps)) == "a"


def test_steps_without_a_compensator_are_skipped_and_finish_works() -> None:
    plain = step(CM, "b", compensator=None, committed_at=NOW - 100)
    assert begins(plan(step(CM, "a", committed_at=NOW - 300), plain)) == "a"
    assert plan(step(CD, "a"), plain, step(FL, "c")) == FinishCompensation()


def test_nothing_left_to_undo_finishes() -> None:
    assert plan() == FinishCompensation()
    assert plan(step(CD, "a"), step(FL, "b")) == FinishCompensation()


@pytest.mark.parametrize("busy", [X0, X1, P0, P1])
def test_waits_while_a_step_is_executing_or_compensating(busy: str) -> None:
    assert plan(step(CM, "a"), step(busy, "b")) == Wait()


@pytest.mark.parametrize("unknown", [AM, PA])
def test_ambiguity_goes_to_review(unknown: str) -> None:
    decision = plan(step(CM, "a"), step(unknown, "b"))
    assert isinstance(decision, Review)
    assert decision.error_code in codes.AUTO_LIFTED
    assert "'b'" in decision.reason


def test_planner_leaves_the_saga_alone() -> None:
    record = saga(step(CM, "a"), state=SagaState.COMPENSATING)
    before = repr(record)
    plan_compensation(record, NOW, MAX)
    assert repr(record) == before


# ---------------------------------------------------------------- backoff


@pytest.mark.parametrize(("attempt", "expected"), [(1, 100), (2, 200), (3, 400), (10, 51_200),
                                                   (11, 60_000), (12, 60_000), (10_000, 60_000)])
def test_default_backoff(attempt: int, expected: int) -> None:
    assert default_backoff_ms(attempt) == expected
    assert type(default_backoff_ms(attempt)) is int


@given(attempt=st.integers(1, 10_000), draw=st.floats(0.0, 1.0))
def test_full_jitter_stays_within_zero_and_the_default_ceiling(attempt: int, draw: float) -> None:
    ceiling = default_backoff_ms(attempt)
    delay = full_jitter_ms(ceiling, draw)
    assert type(delay) is int
    assert 0 <= delay <= ceiling <= 60_000


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 0), (0.25, 100), (0.5, 200), (0.9999, 399),
                                                (1.0, 400)])
def test_full_jitter_is_the_drawn_part_of_the_ceiling(draw: float, expected: int) -> None:
    assert full_jitter_ms(400, draw) == expected


@pytest.mark.parametrize(("draw", "expected"), [(-0.5, 0), (1.5, 400), (float("nan"), 0),
                                                (float("inf"), 400), (float("-inf"), 0)])
def test_a_draw_outside_zero_to_one_is_clamped(draw: float, expected: int) -> None:
    assert full_jitter_ms(400, draw) == expected


def test_full_jitter_draws_nothing_itself() -> None:
    assert {full_jitter_ms(60_000, 0.3) for _ in range(50)} == {18_000}


@pytest.mark.parametrize("delay", [0, 1, 100, 60_000, MAX_BACKOFF_MS])
def test_valid_backoff_is_kept(delay: int) -> None:
    assert check_backoff(delay) == delay


@pytest.mark.parametrize(
    "delay",
    [-1, -60_000, 1.0, 100.5, float("nan"), float("inf"), True, False, MAX_BACKOFF_MS + 1,
     MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, 10**30,
     None, "100", [100]],
    ids=repr,
)
def test_invalid_backoff_is_none(delay: object) -> None:
    assert check_backoff(delay) is None
