"""Compensation retries: a failed compensator is retried by the sweep
when its backoff is due, under the same compensation effect id, up to the definition's
max_attempts; an exhausted budget or an invalid backoff stops for an operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import CardDeclined, Shop, kinds

BACKOFF_MS = 1_000


def _reserve_then_decline(shop: Shop, name: str, **policy: Any) -> Any:
    """A definition (with the given retry policy) whose second step is declined."""
    tasks = shop.tasks

    def run(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        return ctx.step(tasks["charge"], order["card"], order["total"])

    definition = shop.sagas.saga(name, **policy)(run)
    shop.script.then("charge", CardDeclined())
    return definition


def _start(shop: Shop, definition: Any) -> None:
    definition.start({"sku": "sku-1", "qty": 1, "card": "c", "total": 5}, saga_id="r-1")
    shop.driver.run_until_idle()


def _linear(attempt: int) -> int:
    """The retry policy under test: seconds, as every backoff returns."""
    return BACKOFF_MS * attempt // 1000


def _linear_ms(attempt: int) -> int:
    return _linear(attempt) * 1000


def test_a_failed_compensator_leaves_the_step_compensation_failed_with_a_retry_time(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", RuntimeError("inventory down"))

    # when
    _start(shop, definition)

    # then
    step = shop.step("shop.reserve", "r-1")
    assert step.state == StepState.COMPENSATION_FAILED
    assert step.error_code == "compensation_failed"
    assert step.compensation_attempts == 1
    assert step.next_attempt_at_ms == shop.clock.now_ms() + BACKOFF_MS
    assert shop.record("r-1").state == SagaState.COMPENSATING


def test_no_compensation_retry_is_sent_before_it_is_due(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", RuntimeError("inventory down"))
    _start(shop, definition)
    assert shop.driver.take() == []

    # when
    shop.clock.advance(BACKOFF_MS - 1)
    shop.sagas.sweep()

    # then
    assert shop.driver.take() == []
    assert shop.step("shop.reserve", "r-1").state == StepState.COMPENSATION_FAILED


def test_the_sweep_sends_a_due_compensation_retry_under_the_same_effect_id(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", RuntimeError("inventory down"))
    _start(shop, definition)
    effect_id = shop.step("shop.reserve", "r-1").compensation_effect_id

    # when
    shop.clock.advance(BACKOFF_MS)
    shop.sagas.sweep()
    sent = shop.driver.take()

    # then
    assert kinds(sent) == [("compensation", "shop.reserve")]
    assert sent[0].effect_id == effect_id
    assert shop.step("shop.reserve", "r-1").compensation_attempts == 2


def test_a_compensator_failing_twice_then_succeeding_compensates_the_saga(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", RuntimeError("one"), RuntimeError("two"))
    _start(shop, definition)

    # when: each retry is swept when due (the second backoff is twice the first)
    for attempt in (1, 2):
        shop.clock.advance(_linear_ms(attempt))
        shop.sagas.sweep()
        shop.driver.run_until_idle()

    # then
    assert shop.record("r-1").state == SagaState.COMPENSATED
    step = shop.step("shop.reserve", "r-1")
    assert (step.state, step.compensation_attempts) == (StepState.COMPENSATED, 3)
    contexts = [call.kwargs["saga"] for call in shop.script.of("release")]
    assert [c.attempt for c in contexts] == [1, 2, 3]
    assert {c.effect_id for c in contexts} == {step.compensation_effect_id}


def test_the_backoff_of_each_retry_is_the_policy_of_that_attempt(shop: Shop) -> None:
    # given: the first retry already failed
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", RuntimeError("one"), RuntimeError("two"))
    _start(shop, definition)
    shop.clock.advance(_linear_ms(1))
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # when: one backoff of the first attempt later
    shop.clock.advance(_linear_ms(1))
    shop.sagas.sweep()

    # then: the second backoff is not over yet
    assert shop.driver.take() == []
    assert shop.step("shop.reserve", "r-1").next_attempt_at_ms == shop.clock.now_ms() + BACKOFF_MS


def test_an_exhausted_compensation_sends_the_saga_to_manual_review(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "retrying", max_attempts=3, backoff=_linear)
    shop.script.then("release", *(RuntimeError(str(n)) for n in range(3)))
    _start(shop, definition)

    # when
    for attempt in (1, 2, 3):
        shop.clock.advance(_linear_ms(attempt))
        shop.sagas.sweep()
        shop.driver.run_until_idle()

    # then
    record = shop.record("r-1")
    assert record.state == SagaState.MANUAL_REVIEW
    assert record.error_code == "compensation_exhausted"
    assert "shop.reserve" in (record.reason or "")
    assert len(shop.script.of("release")) == 3


def test_max_attempts_one_allows_no_compensation_retry(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "once", max_attempts=1, backoff=_linear)
    shop.script.then("release", RuntimeError("inventory down"))
    _start(shop, definition)

    # when
    shop.clock.advance(BACKOFF_MS)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert shop.record("r-1").error_code == "compensation_exhausted"
    assert len(shop.script.of("release")) == 1


def test_the_failure_of_the_last_allowed_attempt_goes_to_manual_review_at_once(shop: Shop) -> None:
    # given
    definition = _reserve_then_decline(shop, "once", max_attempts=1, backoff=_linear)
    shop.script.then("release", RuntimeError("inventory down"))

    # when
    _start(shop, definition)

    # then
    assert shop.record("r-1").state == SagaState.MANUAL_REVIEW


def _raises(_: int) -> int:
    raise ArithmeticError("policy bug")


INVALID_BACKOFFS = [lambda _: -1, lambda _: None, _raises, lambda _: True, lambda _: "100",
                    lambda _: float("nan"), lambda _: 2**53, lambda _: 367 * 24 * 3600]
INVALID_IDS = ["negative", "none", "raises", "bool", "str", "nan", "over-safe-integer",
               "over-a-year"]


@pytest.mark.parametrize("backoff", INVALID_BACKOFFS, ids=INVALID_IDS)
def test_an_invalid_backoff_is_refused_at_decoration(shop: Shop, backoff: Callable[[int], Any]) -> None:
    with pytest.raises(SagaConfigurationError, match="backoff"):
        shop.sagas.saga("bad-policy", max_attempts=3, backoff=backoff)(lambda ctx, _: None)
    assert "bad-policy" not in shop.sagas.registry.definitions


def test_a_backoff_returns_seconds_and_may_be_a_float(shop: Shop) -> None:
    # given: 1.5 s between compensation attempts
    definition = _reserve_then_decline(shop, "float-policy", max_attempts=3, backoff=lambda _: 1.5)
    shop.script.then("release", RuntimeError("inventory down"))

    # when
    _start(shop, definition)

    # then: the retry is due 1.5 s (1500 ms) later
    step = shop.step("shop.reserve", "r-1")
    assert step.state == StepState.COMPENSATION_FAILED
    assert step.next_attempt_at_ms == shop.clock.now_ms() + 1_500


@pytest.mark.parametrize("invalid", [-1, None, 2**53], ids=["negative", "none", "huge"])
def test_a_backoff_invalid_at_run_time_sends_the_saga_to_manual_review(
    shop: Shop, invalid: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a policy that passed the decoration check and then changed its mind
    answers = {"value": 1}
    definition = _reserve_then_decline(shop, "bad-policy", max_attempts=3,
                                       backoff=lambda _: answers["value"])
    answers["value"] = invalid
    shop.script.then("release", RuntimeError("inventory down"))

    # when
    _start(shop, definition)

    # then
    record = shop.record("r-1")
    assert record.state == SagaState.MANUAL_REVIEW
    assert record.error_code == "invalid_retry_policy"
    assert shop.step("shop.reserve", "r-1").state == StepState.COMPENSATION_FAILED
    assert any("invalid_retry_policy" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records)


def test_a_step_without_a_compensator_is_skipped_when_compensating(shop: Shop) -> None:
    # given: notify has nothing to undo; charge is declined after it
    tasks = shop.tasks

    @shop.sagas.saga("notify-then-charge")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], "sku-1", 1)
        ctx.step(tasks["notify"], data["user"])
        return ctx.step(tasks["charge"], "c", 5)

    shop.script.then("charge", CardDeclined())

    # when
    run.start({"user": "ann"}, saga_id="r-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("r-1").state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "notify", "charge", "release"]


def test_compensation_walks_back_in_commit_order_when_a_worker_clock_runs_behind(
    shop: Shop,
) -> None:
    # given: the charge commits on a worker whose clock is 5 s behind the reservation's
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()
    shop.deliver_next()  # reserve commits
    shop.clock.set(shop.clock.now_ms() - 5_000)
    shop.deliver_next()  # charge commits, stamped before the reservation by its clock

    # when: shipping is declined
    shop.driver.run_until_idle()

    # then: the later commit is undone first all the same
    assert [n for n in shop.script.names() if n in ("refund", "release")] == ["refund", "release"]
    reserve, charge = shop.step("shop.reserve"), shop.step("shop.charge")
    assert reserve.committed_at_ms is not None and charge.committed_at_ms is not None
    assert charge.committed_at_ms > reserve.committed_at_ms


def test_a_running_compensator_is_judged_by_its_own_time_limit(shop: Shop) -> None:
    # given: a 10 s step whose 600 s compensator was claimed on another host
    @shop.sagas.step(name="t.quick", compensate="t.slow_undo", time_limit=10)
    def quick(x: int) -> Any:
        return {"ok": x}

    @shop.sagas.compensator(name="t.slow_undo", time_limit=600)
    def slow_undo(x: int, *, result: Any = None) -> None:
        return None

    @shop.sagas.step(name="t.decline", compensate=None)
    def decline() -> Any:
        raise StepNotCommitted("declined")

    @shop.sagas.saga("slow-undo")
    def run(ctx: Any, _: Any) -> None:
        ctx.step(quick, 1)
        ctx.step(decline)

    run.start({}, saga_id="tl-1")
    for _ in range(2):
        shop.deliver_next()  # advance, quick, decline
    [sent] = shop.driver.take()
    assert (sent.kind, sent.step) == ("compensation", "t.quick")
    shop.claim_as("other-host:4242/abcd", "t.quick", saga_id="tl-1", compensation=True)
    grace_ms = shop.sagas.settings.timing.grace_ms

    # when: past the step's limit but within the compensator's
    shop.clock.advance(10_000 + grace_ms + 1_000)
    shop.sagas.sweep()

    # then: it is left running
    assert shop.record("tl-1").state is SagaState.COMPENSATING
    assert shop.driver.take() == []

    # and past its own limit it is an unknown outcome, never guessed
    shop.clock.advance(600_000)
    shop.sagas.sweep()
    record = shop.record("tl-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_compensation")
