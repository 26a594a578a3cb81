"""``compensation="parallel"`` (issue 29 item 4): the planner begins every committed step at
once, keeps attempts, backoff and exhaustion per compensator, and finishes when all are undone.
Each row: the steps, the decision expected (pure, no I/O)."""

from __future__ import annotations

import pytest

from celery_sagas._protocol import codes
from celery_sagas._protocol.compensation import plan_compensation
from celery_sagas._protocol.decisions import (
    BeginCompensation,
    Decision,
    FinishCompensation,
    Review,
    Wait,
)
from celery_sagas._records import SagaRecord, SagaState
from tests.unit.protocol_builders import (
    AM,
    CD,
    CF,
    CM,
    FL,
    NOW,
    P0,
    P1,
    T0,
    X1,
    saga,
    step,
)

DUE = T0 + 5_000  # the builders' next_attempt_at_ms of a failed compensation


def _compensating(*variants: tuple[str, str]) -> SagaRecord:
    return saga(*(step(v, name, committed_at=T0 + 20 + i) for i, (v, name) in enumerate(variants)),
                state=SagaState.COMPENSATING)


def _kind(decision: Decision) -> tuple[str, str | int | None]:
    if isinstance(decision, BeginCompensation):
        return "begin", decision.step.name
    if isinstance(decision, Review):
        return "review", decision.error_code
    if isinstance(decision, Wait):
        return "wait", decision.until_ms
    assert isinstance(decision, FinishCompensation)
    return "finish", None


@pytest.mark.parametrize(("steps", "now", "expected", "reverse"), [
    # three committed: the newest begins first; with the others compensating, the next begins
    ([(CM, "a"), (CM, "b"), (CM, "c")], NOW, ("begin", "c"), ("begin", "c")),
    ([(CM, "a"), (CM, "b"), (P1, "c")], NOW, ("begin", "b"), ("wait", None)),
    ([(CM, "a"), (P0, "b"), (P1, "c")], NOW, ("begin", "a"), ("wait", None)),
    ([(P1, "a"), (P0, "b"), (P1, "c")], NOW, ("wait", None), ("wait", None)),
    # a failed compensator waits for its own retry; the others are not held up by it
    ([(CM, "a"), (CF, "b")], NOW, ("begin", "a"), ("wait", DUE)),
    ([(P1, "a"), (CF, "b")], NOW, ("wait", DUE), ("wait", None)),
    ([(CD, "a"), (CF, "b")], DUE, ("begin", "b"), ("begin", "b")),
    # forward work in flight and ambiguity hold the whole compensation, as in reverse order
    ([(CM, "a"), (X1, "b")], NOW, ("wait", None), ("wait", None)),
    ([(CM, "a"), (AM, "b")], NOW, ("review", codes.AMBIGUOUS_STEP),
     ("review", codes.AMBIGUOUS_STEP)),
    # done when every committed step is undone (failed steps had nothing to undo)
    ([(CD, "a"), (FL, "b"), (CD, "c")], NOW, ("finish", None), ("finish", None)),
])
def test_the_parallel_planner(steps: list[tuple[str, str]], now: int,
                              expected: tuple[str, str | int | None],
                              reverse: tuple[str, str | int | None]) -> None:
    record = _compensating(*steps)
    assert _kind(plan_compensation(record, now, 3, parallel=True)) == expected
    assert _kind(plan_compensation(record, now, 3)) == reverse  # what reverse order does


def test_an_exhausted_compensator_goes_to_review_once_the_others_settled() -> None:
    exhausted = step(CF, "b", compensation_attempts=3)
    running = saga(step(P1, "a"), exhausted, state=SagaState.COMPENSATING)
    assert _kind(plan_compensation(running, NOW, 3, parallel=True)) == ("wait", None)
    settled = saga(step(CD, "a"), exhausted, state=SagaState.COMPENSATING)
    assert _kind(plan_compensation(settled, NOW, 3, parallel=True)) == (
        "review", codes.COMPENSATION_EXHAUSTED)
