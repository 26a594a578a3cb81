"""Step failures: a known failure compensates, an unknown one goes to
manual review without compensating, and an idempotent step is retried under its effect id."""

from __future__ import annotations

from typing import Any

from celery_sagas import Sagas, StepNotCommitted
from celery_sagas._records import SagaState, StepState
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.dispatcher import Sent
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import SYNC_BACKOFF_MS, CardDeclined, Script, Shop, kinds


def test_step_not_committed_fails_the_step_with_its_code_and_compensates(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert record.state == SagaState.COMPENSATED
    ship = shop.step("shop.ship")
    assert (ship.state, ship.error_code) == (StepState.FAILED, "out_of_stock")
    assert [s.state for s in record.steps[:2]] == [StepState.COMPENSATED, StepState.COMPENSATED]


def test_a_known_failure_turns_the_saga_compensating_and_dispatches_the_newest_compensator(
    shop: Shop,
) -> None:
    # given: reserve and charge committed, ship's message pending
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()
    for _ in range(2):
        shop.deliver_next()

    # when
    shop.deliver_next()  # ship fails

    # then
    record = shop.record()
    assert record.state == SagaState.COMPENSATING
    assert record.error_code == "out_of_stock"
    sent = shop.driver.take()
    assert kinds(sent) == [("compensation", "shop.charge")]
    assert sent[0].effect_id == shop.step("shop.charge").compensation_effect_id


def test_compensators_run_in_reverse_order_of_the_committed_steps(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then: the failed step itself is not compensated
    assert shop.script.names() == ["reserve", "charge", "ship", "refund", "release"]


def test_a_compensator_gets_the_step_args_kwargs_and_committed_result(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    release = shop.script.of("release")[0]
    assert release.args == ("sku-1", 2)
    assert release.kwargs["warehouse"] == "east"
    assert release.kwargs["result"] == {"reservation": "r-sku-1"}
    assert shop.script.of("refund")[0].kwargs["result"] == {"charge": "ch-card-1"}


def test_a_compensator_gets_a_saga_context_with_the_compensation_effect_id(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    ctx = shop.script.of("release")[0].kwargs["saga"]
    step = shop.step("shop.reserve")
    assert (ctx.saga_id, ctx.step, ctx.effect_id, ctx.attempt) == (
        "o-1", "shop.reserve", step.compensation_effect_id, 1,
    )
    assert ctx.effect_id != step.effect_id
    assert ctx.stage == "compensation"


def test_a_declared_not_committed_exception_counts_as_a_known_failure(shop: Shop) -> None:
    # given
    shop.script.then("charge", CardDeclined("insufficient funds"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    charge = shop.step("shop.charge")
    assert charge.state == StepState.FAILED
    assert charge.error_code == "card_declined"  # the exception class, in snake case
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "charge", "release"]


def test_a_failure_of_the_first_step_compensates_nothing_and_ends_compensated(shop: Shop) -> None:
    # given
    shop.script.then("reserve", StepNotCommitted("no_stock"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve"]


def test_an_unknown_exception_makes_the_step_ambiguous_and_the_saga_manual_review(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset after the request left"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    charge = shop.step("shop.charge")
    assert charge.state == StepState.AMBIGUOUS
    assert record.state == SagaState.MANUAL_REVIEW
    assert record.error_code == "ambiguous_step"


def test_the_manual_review_reason_names_the_step_and_its_effect_id(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    reason = shop.record().reason or ""
    assert "shop.charge" in reason
    assert shop.step("shop.charge").effect_id in reason


def test_an_ambiguous_step_runs_no_compensation(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then: reserve stays committed, no compensator ran or was sent
    assert shop.script.names() == ["reserve", "charge"]
    assert shop.step("shop.reserve").state == StepState.COMMITTED
    assert shop.driver.take() == []


def test_a_non_json_step_result_is_not_committed_as_a_result(shop: Shop) -> None:
    # given: the body returned something the store cannot hold; its effect happened, though
    shop.script.then("charge", lambda: {"at": object()})
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.step("shop.charge").state == StepState.AMBIGUOUS
    assert shop.record().state == SagaState.MANUAL_REVIEW


# ------------------------------------------------------------ idempotent steps


def test_an_idempotent_step_is_retried_instead_of_going_ambiguous(shop: Shop) -> None:
    # given: notify's retries are due at once, so the same delivery runs them
    shop.script.then("notify", ConnectionError("reset"))
    shop.notify_user.start({"user": "ann"}, saga_id="n-1")

    # when
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.notify", "n-1")
    assert (step.state, step.attempts) == (StepState.COMMITTED, 2)
    assert shop.record("n-1").state == SagaState.COMPLETED


def test_an_idempotent_step_succeeds_on_its_third_attempt_under_one_effect_id(shop: Shop) -> None:
    # given
    shop.script.then("notify", ConnectionError("one"), TimeoutError("two"))
    shop.notify_user.start({"user": "ann"}, saga_id="n-1")

    # when
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.notify", "n-1")
    assert (step.state, step.attempts, step.result) == (StepState.COMMITTED, 3, {"sent": "ann"})
    contexts = [call.kwargs["saga"] for call in shop.script.of("notify")]
    assert [c.attempt for c in contexts] == [1, 2, 3]
    assert {c.effect_id for c in contexts} == {step.effect_id}


def test_an_idempotent_step_that_exhausts_its_retries_goes_ambiguous(shop: Shop) -> None:
    # given: retries=2 allows three attempts
    shop.script.then("notify", ConnectionError("1"), ConnectionError("2"), ConnectionError("3"))
    shop.notify_user.start({"user": "ann"}, saga_id="n-1")

    # when
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.notify", "n-1")
    assert (step.state, step.attempts) == (StepState.AMBIGUOUS, 3)
    assert shop.record("n-1").state == SagaState.MANUAL_REVIEW
    assert len(shop.script.of("notify")) == 3


def test_a_known_failure_of_an_idempotent_step_is_not_retried(shop: Shop) -> None:
    # given
    shop.script.then("notify", StepNotCommitted("unknown_user"))
    shop.notify_user.start({"user": "ann"}, saga_id="n-1")

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.step("shop.notify", "n-1").state == StepState.FAILED
    assert shop.record("n-1").state == SagaState.COMPENSATED
    assert len(shop.script.of("notify")) == 1


def test_a_later_idempotent_retry_is_left_to_the_sweep(shop: Shop) -> None:
    # given: sync's retry is due a minute later
    shop.script.then("sync", ConnectionError("reset"))
    shop.sync_user.start({"user": "ann"}, saga_id="s-1")

    # when
    shop.driver.run_until_idle()

    # then: the step waits, released, with its retry time stored
    step = shop.step("shop.sync", "s-1")
    assert step.state == StepState.EXECUTING
    assert step.attempts == 1 and step.started_at_ms is None
    assert step.next_attempt_at_ms == shop.clock.now_ms() + SYNC_BACKOFF_MS
    assert shop.record("s-1").state == SagaState.RUNNING
    assert shop.driver.take() == []


def test_the_sweep_does_not_send_an_idempotent_retry_before_it_is_due(shop: Shop) -> None:
    # given
    shop.script.then("sync", ConnectionError("reset"))
    shop.sync_user.start({"user": "ann"}, saga_id="s-1")
    shop.driver.run_until_idle()

    # when: the saga is stale, but the retry is 1 ms from due
    shop.clock.advance(SYNC_BACKOFF_MS - 1)
    shop.sagas.sweep()

    # then
    assert shop.driver.take() == []


def test_the_sweep_sends_a_due_idempotent_retry_under_the_same_effect_id(shop: Shop) -> None:
    # given
    shop.script.then("sync", ConnectionError("reset"))
    shop.sync_user.start({"user": "ann"}, saga_id="s-1")
    shop.driver.run_until_idle()
    effect_id = shop.step("shop.sync", "s-1").effect_id

    # when
    shop.clock.advance(SYNC_BACKOFF_MS)
    shop.sagas.sweep()
    sent = shop.driver.take()

    # then
    assert kinds(sent) == [("step", "shop.sync")]
    assert sent[0].effect_id == effect_id


def test_a_retry_sent_by_the_sweep_runs_and_completes_the_saga(shop: Shop) -> None:
    # given
    shop.script.then("sync", ConnectionError("one"), ConnectionError("two"))
    shop.sync_user.start({"user": "ann"}, saga_id="s-1")
    shop.driver.run_until_idle()

    # when
    for _ in range(2):
        shop.clock.advance(SYNC_BACKOFF_MS)
        shop.sagas.sweep()
        shop.driver.run_until_idle()

    # then
    step = shop.step("shop.sync", "s-1")
    assert (step.state, step.attempts) == (StepState.COMMITTED, 3)
    assert shop.record("s-1").state == SagaState.COMPLETED
    assert {c.kwargs["saga"].effect_id for c in shop.script.of("sync")} == {step.effect_id}


def test_an_early_redelivery_of_a_released_step_does_not_run_the_body(shop: Shop) -> None:
    # given: the step was released for a retry a minute from now
    shop.script.then("sync", ConnectionError("reset"))
    shop.sync_user.start({"user": "ann"}, saga_id="s-1")
    shop.driver.run_until_idle()
    step = shop.step("shop.sync", "s-1")

    # when: the broker redelivers the old message now
    shop.driver.deliver(Sent("step", "s-1", step.name, step.effect_id))

    # then
    assert len(shop.script.of("sync")) == 1
    assert shop.step("shop.sync", "s-1") == step


def test_a_due_idempotent_retry_is_sent_by_the_next_sweep_even_before_the_saga_is_stale(
    sagas: Sagas, driver: SagaDriver, clock: FrozenClock, script: Script
) -> None:
    # given: an idempotent step whose retry is due after 10 s
    @sagas.step(name="shop.ping", compensate=None, idempotent=True, retries=1, backoff=lambda _: 10)
    def ping() -> Any:
        return script.play("ping", (), {}, "pong")

    @sagas.saga("ping")
    def run(ctx: Any, _: Any) -> Any:
        return ctx.step(ping)

    script.then("ping", ConnectionError("reset"))
    run.start({}, saga_id="p-1")
    driver.run_until_idle()

    # when: one sweep interval after the retry became due
    clock.advance(10_000 + int(sagas.settings.sweep_interval_s * 1000))
    sagas.sweep()

    # then
    assert kinds(driver.take()) == [("step", "shop.ping")]


def test_recorded_arguments_the_function_no_longer_takes_fail_the_step_before_its_body(
    shop: Shop,
) -> None:
    # given: a step recorded with two arguments, run by code that takes one (a deploy changed it)
    ran: list[int] = []

    @shop.sagas.step(name="t.one", compensate=None)
    def one(a: int) -> None:
        ran.append(a)

    @shop.sagas.saga("changed-signature")
    def run(ctx: Any, _: Any) -> None:
        ctx.step(shop.tasks["reserve"], "sku-1", 1)
        ctx.step(one, 1, 2)

    # when
    run.start({}, saga_id="b-1")
    shop.driver.run_until_idle()

    # then: the body never began, so the step did not commit and the saga rolled back
    step = shop.step("t.one", "b-1")
    assert (step.state, step.error_code) == (StepState.FAILED, "arguments_mismatch")
    assert ran == []
    assert shop.record("b-1").state is SagaState.COMPENSATED
    assert "release" in shop.script.names()
