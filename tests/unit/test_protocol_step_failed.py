"""A step's known failure left to ``run`` (``StepFailed``, issue 29 item 2), and the compensation
reason compensators read (item 3): the moves and the replay rule, from tables."""

from __future__ import annotations

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.compensation import rollback_reason
from celery_sagas._records import AttemptRef, SagaState, StepState
from tests.unit.protocol_builders import (
    CM,
    COMPENSATING,
    CONTEXTS,
    FL,
    NOW,
    REVIEW_FORWARD,
    REVIEW_ROLLBACK,
    RUNNING,
    X1,
    assert_refused,
    in_context,
    saga,
    step,
)

SS = SagaState


@pytest.mark.parametrize("context", CONTEXTS)
def test_a_catchable_failure_turns_back_only_a_saga_that_cannot_ask_run(context: str) -> None:
    record = in_context(context, X1)
    ref = AttemptRef.execution(record.steps[0])
    if context not in (RUNNING, COMPENSATING, REVIEW_FORWARD, REVIEW_ROLLBACK):
        assert_refused(lambda s: moves.fail_step(s, ref, "card_declined", NOW, catchable=True),
                       record)
        return
    caught = moves.fail_step(record, ref, "card_declined", NOW, catchable=True)
    plain = moves.fail_step(record, ref, "card_declined", NOW)
    assert caught.steps[0].state is StepState.FAILED
    assert caught.steps[0].error_code == "card_declined"
    assert caught.version == record.version + 1
    if context == RUNNING:
        # left to run: the saga goes on running, nothing rolls back yet
        assert (caught.state, caught.rolling_back, caught.error_code) == (SS.RUNNING, False, None)
        assert plain.state is SS.COMPENSATING
    else:
        assert caught == plain


def test_a_failure_in_a_parallel_group_is_never_left_to_run() -> None:
    record = saga(step(X1, "a", group="parallel-1"), step(X1, "b", group="parallel-1"))
    after = moves.fail_step(record, AttemptRef("a", "fx-a", 1), "out_of_stock", NOW,
                            catchable=True)
    assert (after.state, after.rolling_back) == (SS.COMPENSATING, True)


def test_a_saga_whose_caught_failure_came_before_a_new_failure_names_the_new_one() -> None:
    record = saga(step(CM, "a"), step(FL, "b"), step(X1, "c"))
    after = moves.fail_step(record, AttemptRef("c", "fx-c", 1), "out_of_stock", NOW)
    assert (after.state, after.error_code) == (SS.COMPENSATING, "out_of_stock")
    assert "'c'" in (after.reason or "")
    assert rollback_reason(after) == ("c", "out_of_stock")


def test_a_saga_with_a_caught_failure_completes() -> None:
    record = saga(step(CM, "a"), step(FL, "b"), step(CM, "c", committed_at=NOW - 1))
    assert moves.complete(record, NOW).state is SS.COMPLETED


@pytest.mark.parametrize(("code", "reason", "expected"), [
    (codes.CANCELLED, "cancelled", (None, codes.CANCELLED)),
    ("over_budget", "run() refused to go on (over_budget)", (None, "over_budget")),
    ("card_declined", "step 'b' did not commit", ("b", "card_declined")),
])
def test_rollback_reason_names_the_step_and_code(code: str, reason: str,
                                                 expected: tuple[str | None, str]) -> None:
    record = saga(step(CM, "a"), step(FL, "b"), state=SS.COMPENSATING, error_code=code,
                  reason=reason)
    assert rollback_reason(record) == expected
