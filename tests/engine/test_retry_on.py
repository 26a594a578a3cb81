"""``retry_on=``: exception types that prove nothing was committed and are worth another try
(a rate limit). Retried with the step's backoff up to ``retries``, even on a step that is not
idempotent, then the step fails with a known outcome and the saga compensates (issue 29 item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas import StepFailed
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import CardDeclined, Shop


class RateLimited(Exception):
    """The provider answered 429: nothing was done."""


def _limited_saga(shop: Shop, **options: Any) -> Any:
    """reserve, then a rate-limited ``t.call`` (declared with ``options``)."""
    reserve = shop.tasks["reserve"]

    @shop.sagas.step(name="t.call", compensate=None, backoff=lambda _: 0, **options)
    def call(user: str) -> Any:
        return shop.script.play("t.call", (user,), {}, {"called": user})

    @shop.sagas.saga("limited")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        return ctx.step(call, data["user"])

    return run


def test_retry_on_retries_then_succeeds_on_a_step_that_is_not_idempotent(shop: Shop) -> None:
    # given: a step that is not idempotent, rate limited twice
    definition = _limited_saga(shop, retry_on=(RateLimited,), retries=3)
    shop.script.then("t.call", RateLimited("429"), RateLimited("429"))

    # when
    definition.start({"user": "u"}, saga_id="r-1")
    shop.driver.run_until_idle()

    # then: the third attempt committed under the same effect id
    step = shop.step("t.call", "r-1")
    assert (step.state, step.attempts) == (StepState.COMMITTED, 3)
    assert shop.record("r-1").state == SagaState.COMPLETED


def test_retry_on_exhausted_is_a_known_failure_and_compensates(shop: Shop) -> None:
    # given: a step retried 3 times on RateLimited, limited every time
    definition = _limited_saga(shop, retry_on=(RateLimited,), retries=3)
    shop.script.then("t.call", *(RateLimited("429") for _ in range(4)))

    # when
    definition.start({"user": "u"}, saga_id="r-1")
    shop.driver.run_until_idle()

    # then: 1 + 3 attempts, then failed (known), the reservation released, no review
    step = shop.step("t.call", "r-1")
    assert (step.state, step.attempts, step.error_code) == (StepState.FAILED, 4, "rate_limited")
    assert shop.script.names().count("t.call") == 4
    assert shop.script.names().count("release") == 1
    record = shop.record("r-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "rate_limited")


def test_retry_on_exhausted_raises_step_failed_in_run_which_may_go_on(shop: Shop) -> None:
    # given: run catches the failure of a call whose retry runs out and notifies instead
    @shop.sagas.step(name="t.call", compensate=None, backoff=lambda _: 0,
                     retry_on=(RateLimited,), retries=1)
    def call(user: str) -> Any:
        return shop.script.play("t.call", (user,), {}, {"called": user})

    caught: list[tuple[str, str]] = []

    @shop.sagas.saga("limited-or-notify")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        try:
            return ctx.step(call, data["user"])
        except StepFailed as failed:
            caught.append((failed.step, failed.code))
            return ctx.step(shop.tasks["notify"], data["user"])

    shop.script.then("t.call", RateLimited("429"), RateLimited("429"))

    # when
    run.start({"user": "u"}, saga_id="r-1")
    shop.driver.run_until_idle()

    # then: 1 + 1 attempts, StepFailed(rate_limited) caught, completed on the notification
    assert caught[0] == ("t.call", "rate_limited")
    record = shop.record("r-1")
    assert record.state == SagaState.COMPLETED
    assert [(s.name, s.state) for s in record.steps] == [
        ("t.call", StepState.FAILED), ("shop.notify", StepState.COMMITTED)]
    assert shop.script.names() == ["t.call", "t.call", "notify"]


def test_an_undeclared_exception_of_a_retry_on_step_stays_ambiguous(shop: Shop) -> None:
    # given: a step that is not idempotent; retry_on does not make other errors retryable
    definition = _limited_saga(shop, retry_on=(RateLimited,), retries=3)
    shop.script.then("t.call", ConnectionError("reset"))

    definition.start({"user": "u"}, saga_id="r-1")
    shop.driver.run_until_idle()

    assert shop.step("t.call", "r-1").state == StepState.AMBIGUOUS
    assert shop.record("r-1").state == SagaState.MANUAL_REVIEW
    assert shop.script.names().count("t.call") == 1


def test_retry_on_defaults_to_two_retries(shop: Shop) -> None:
    _limited_saga(shop, retry_on=(RateLimited,))
    assert shop.sagas.registry.step("t.call").retries == 2


@pytest.mark.parametrize("retry_on", [RateLimited, "RateLimited", (RateLimited, 3), (KeyboardInterrupt,)])
def test_retry_on_that_is_not_exception_classes_is_refused(shop: Shop, retry_on: Any) -> None:
    if retry_on is RateLimited:  # a single class is taken as a tuple of one
        _limited_saga(shop, retry_on=retry_on)
        assert shop.sagas.registry.step("t.call").retry_on == (RateLimited,)
        return
    with pytest.raises(SagaConfigurationError, match="retry_on"):
        _limited_saga(shop, retry_on=retry_on)
    assert "t.call" not in shop.sagas.registry.steps


def test_retries_without_idempotent_or_retry_on_is_still_refused(shop: Shop) -> None:
    with pytest.raises(SagaConfigurationError, match="idempotent=True or retry_on="):
        _limited_saga(shop, retries=3)


def test_a_retry_on_branch_waiting_for_its_retry_fails_cleanly_when_a_sibling_fails(
        shop: Shop) -> None:
    # given: a rate-limited branch whose retry is due in a minute, beside a declined charge
    @shop.sagas.step(name="t.slow", compensate=None, retry_on=(RateLimited,), retries=3,
                     backoff=lambda _: 60)
    def slow(user: str) -> Any:
        return shop.script.play("t.slow", (user,), {}, {"called": user})

    charge = shop.tasks["charge"]

    @shop.sagas.saga("limited-fan")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.parallel(ctx.call(slow, "u"), ctx.call(charge, "card-1", 30))

    shop.script.then("t.slow", RateLimited("429"))
    shop.script.then("charge", CardDeclined("no"))

    # when
    run.start({}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then: its last attempt committed nothing, so it failed (no review), never retried
    step = shop.step("t.slow", "f-1")
    assert (step.state, step.error_code, step.attempts) == (StepState.FAILED, "rate_limited", 1)
    assert shop.record("f-1").state == SagaState.COMPENSATED
    assert shop.script.names().count("t.slow") == 1
