"""An idempotent step with a retry pending when its saga starts rolling back.

Its last attempt began and raised, so its outcome is unknown; no retry is claimed while the
saga rolls back, so the step is ambiguous and the saga goes to manual review once the others
settle. It is never failed as ``not_started`` (its body ran) and never compensated blindly.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._protocol import codes
from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import Shop

BOOK = "t.book"
LATER_MS = 60_000  # a retry the sweep would send, not one run inside the delivery


@pytest.fixture
def book(shop: Shop) -> Any:
    """An idempotent booking step (two retries, a minute apart) and its compensator."""

    @shop.sagas.step(name=BOOK, compensate="t.unbook", idempotent=True, retries=2,
                     backoff=lambda _: LATER_MS // 1000)
    def book_step(place: str) -> Any:
        return shop.script.play("book", (place,), {}, {"booked": place})

    @shop.sagas.compensator(name="t.unbook")
    def unbook(place: str, *, result: Any = None) -> None:
        shop.script.play("unbook", (place,), {}, None)

    @shop.sagas.saga("trip-fan")
    def trip_fan(ctx: Any, _: Any) -> Any:
        return ctx.parallel(ctx.call(book_step, "hotel"), ctx.call(shop.tasks["charge"], "card", 5))

    @shop.sagas.saga("trip")
    def trip(ctx: Any, _: Any) -> Any:
        ctx.step(book_step, "hotel")
        return ctx.step(shop.tasks["charge"], "card", 5)

    return book_step


def assert_reviewed_not_guessed(shop: Shop, saga_id: str) -> None:
    """The booking is ambiguous, the saga in review; nothing was undone or run twice."""
    record = shop.record(saga_id)
    step = record.step(BOOK)
    assert step is not None
    assert (step.state, step.error_code, step.attempts) == (StepState.AMBIGUOUS, codes.STEP_ERROR, 1)
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, codes.AMBIGUOUS_STEP)
    assert step.effect_id in (record.reason or "")
    assert shop.script.names().count("book") == 1
    assert "unbook" not in shop.script.names()


def released_after_one_attempt(shop: Shop, saga_id: str) -> None:
    step = shop.step(BOOK, saga_id)
    assert (step.state, step.attempts, step.started_at_ms) == (StepState.EXECUTING, 1, None)
    assert step.next_attempt_at_ms is not None


def test_a_sibling_failing_sends_a_released_branch_to_review(shop: Shop, book: Any) -> None:
    # given: the booking branch raised after its request left, and waits a minute to retry
    shop.sagas.start("trip-fan", {}, saga_id="f-1")
    sent = {m.step: m for m in shop.driver.take()}
    shop.script.then("book", RuntimeError("connection reset after the request left"))
    shop.driver.deliver(sent[BOOK])
    released_after_one_attempt(shop, "f-1")

    # when: the card is declined
    shop.script.then("charge", StepNotCommitted("declined"))
    shop.driver.deliver(sent["shop.charge"])
    shop.driver.run_until_idle()

    # then
    assert_reviewed_not_guessed(shop, "f-1")


def test_cancel_sends_a_released_step_to_review(shop: Shop, book: Any) -> None:
    shop.sagas.start("trip", {}, saga_id="c-1")
    shop.script.then("book", TimeoutError("no answer after the request left"))
    shop.deliver_next()
    released_after_one_attempt(shop, "c-1")

    shop.sagas.cancel("c-1")
    shop.driver.run_until_idle()
    shop.clock.advance(LATER_MS)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    assert_reviewed_not_guessed(shop, "c-1")


def test_an_attempt_erroring_while_the_saga_rolls_back_is_not_released(
    shop: Shop, book: Any
) -> None:
    shop.sagas.start("trip-fan", {}, saga_id="f-2")
    sent = {m.step: m for m in shop.driver.take()}

    def sibling_declined_meanwhile() -> None:
        shop.script.then("charge", StepNotCommitted("declined"))
        shop.driver.deliver(sent["shop.charge"])
        raise RuntimeError("socket closed after the request left")

    shop.script.then("book", sibling_declined_meanwhile)
    shop.driver.deliver(sent[BOOK])
    shop.driver.run_until_idle()

    assert_reviewed_not_guessed(shop, "f-2")


@pytest.mark.parametrize(
    ("outcome", "undone"), [("committed", ["unbook"]), ("not-committed", [])]
)
def test_the_operator_answer_finishes_the_rollback(
    shop: Shop, book: Any, outcome: str, undone: list[str]
) -> None:
    # given: a cancelled trip whose booking is under review
    test_cancel_sends_a_released_step_to_review(shop, book)
    effect_id = shop.step(BOOK, "c-1").effect_id
    result = {"booked": "hotel"} if outcome == "committed" else None

    # when: the provider says whether the booking exists, and the operator resumes
    shop.sagas.resolve("c-1", BOOK, effect_id, outcome, result=result)
    shop.sagas.resume("c-1")
    shop.driver.run_until_idle()

    # then: a booking that exists is undone once; one that does not is left alone
    assert shop.record("c-1").state is SagaState.COMPENSATED
    assert [n for n in shop.script.names() if n == "unbook"] == undone
