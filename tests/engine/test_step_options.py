"""Step options that cannot work are refused when the step is decorated, not discovered
when a worker crashes (issue 16 items 2-4): retries, idempotence and the backoff policy."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._protocol import codes
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import HOST, Shop


def _one_step_saga(shop: Shop, name: str, **options: Any) -> Any:
    """A saga of one step ``name`` (declared with ``options``) whose body follows the script."""

    @shop.sagas.step(name=name, compensate=None, **options)
    def body(user: str) -> Any:
        return shop.script.play(name, (user,), {}, {"done": user})

    @shop.sagas.saga(f"{name}-saga")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.step(body, data["user"])

    return run


def test_idempotent_alone_retries_three_attempts_in_all(shop: Shop) -> None:
    # given: a step declared idempotent, nothing else
    definition = _one_step_saga(shop, "t.idem", idempotent=True, backoff=lambda _: 0)
    shop.script.then("t.idem", ConnectionError("reset"), ConnectionError("reset"))

    # when: its first two attempts raise after the request left
    definition.start({"user": "u"}, saga_id="i-1")
    shop.driver.run_until_idle()

    # then: the third attempt commits under the same effect id
    step = shop.step("t.idem", "i-1")
    assert (step.state, step.attempts) == (StepState.COMMITTED, 3)
    assert shop.sagas.registry.step("t.idem").retries == 2
    assert shop.record("i-1").state == SagaState.COMPLETED


def test_idempotent_with_the_default_backoff_retries_a_killed_attempt(shop: Shop, dead_pid: int) -> None:
    # given: an idempotent step whose first attempt was claimed by a process now dead
    definition = _one_step_saga(shop, "t.idem", idempotent=True)
    definition.start({"user": "u"}, saga_id="i-1")
    [message] = shop.driver.take()
    shop.claim_as(f"{HOST}:{dead_pid}/x", "t.idem", "i-1")

    # when: the message is delivered again (the broker requeued it)
    shop.driver.deliver(message)
    shop.driver.run_until_idle()

    # then: retried, not sent to manual review
    assert shop.record("i-1").state == SagaState.COMPLETED
    assert shop.step("t.idem", "i-1").attempts == 2


def test_retries_zero_stays_available_explicitly(shop: Shop) -> None:
    definition = _one_step_saga(shop, "t.once", idempotent=True, retries=0)
    shop.script.then("t.once", ConnectionError("reset"))

    definition.start({"user": "u"}, saga_id="o-1")
    shop.driver.run_until_idle()

    assert shop.step("t.once", "o-1").state == StepState.AMBIGUOUS
    assert shop.record("o-1").state == SagaState.MANUAL_REVIEW


def test_retries_without_idempotent_is_refused(shop: Shop) -> None:
    with pytest.raises(SagaConfigurationError, match="needs idempotent=True"):
        _one_step_saga(shop, "t.guess", retries=3)
    assert "t.guess" not in shop.sagas.registry.steps


@pytest.mark.parametrize("retries", [True, -1, 2**60, 101, 1.5, "3"])
def test_retries_that_are_not_a_small_int_are_refused(shop: Shop, retries: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="retries must be an int"):
        _one_step_saga(shop, "t.bad", idempotent=True, retries=retries)
    assert "t.bad" not in shop.sagas.registry.steps
    assert "t.bad" not in shop.sagas.app.tasks


@pytest.mark.parametrize("backoff", [lambda _: 1.5, lambda _: 0, lambda attempt: attempt * 0.25])
def test_a_step_backoff_returns_seconds_floats_allowed(shop: Shop, backoff: Any) -> None:
    _one_step_saga(shop, "t.ok", idempotent=True, backoff=backoff)
    options = shop.sagas.registry.step("t.ok")
    assert options.backoff(1) == round(backoff(1) * 1000)


def _raises(_: int) -> float:
    raise ZeroDivisionError


@pytest.mark.parametrize(
    "backoff",
    [lambda _: None, lambda _: -1, lambda _: -0.5, lambda _: float("inf"), lambda _: "1",
     lambda _: True, lambda _: 400 * 24 * 3600, _raises, lambda attempt: 1 if attempt < 3 else None,
     42],
    ids=["none", "negative", "negative-float", "inf", "str", "bool", "over-a-year", "raises",
         "invalid-on-the-last-retry", "not-callable"],
)
def test_a_step_backoff_that_cannot_work_is_refused_at_decoration(shop: Shop, backoff: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="backoff"):
        _one_step_saga(shop, "t.bad", idempotent=True, retries=3, backoff=backoff)
    assert "t.bad" not in shop.sagas.registry.steps


@pytest.mark.parametrize("max_attempts", [0, True, 2**60, 1.0])
def test_a_saga_max_attempts_out_of_range_is_refused(shop: Shop, max_attempts: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="max_attempts"):
        shop.sagas.saga("t.bad-saga", max_attempts=max_attempts)(lambda ctx, _: None)


@pytest.mark.parametrize("invalid", [None, -1, 2**53])
def test_a_step_backoff_invalid_at_run_time_is_invalid_retry_policy(
    shop: Shop, invalid: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a policy that passed the decoration check, then changed its answer
    answers: dict[str, Any] = {"value": 0}
    definition = _one_step_saga(shop, "t.flaky", idempotent=True, backoff=lambda _: answers["value"])
    answers["value"] = invalid
    shop.script.then("t.flaky", ConnectionError("reset"))

    # when: the first attempt raises after the request left
    definition.start({"user": "u"}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then: no retry can be scheduled: the step is ambiguous under invalid_retry_policy, the
    # saga waits for an operator, and the worker log says why
    step = shop.step("t.flaky", "f-1")
    assert (step.state, step.error_code) == (StepState.AMBIGUOUS, codes.INVALID_RETRY_POLICY)
    assert shop.record("f-1").state == SagaState.MANUAL_REVIEW
    assert any(r.levelname == "ERROR" and "invalid_retry_policy" in r.getMessage()
               for r in caplog.records)
