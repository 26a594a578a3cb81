"""Delivery faults: at-least-once delivery, lost messages and vanished
workers. The start claim makes duplicates harmless; a claim whose process is gone, or that
went silent past its time limit plus grace, is ambiguous (or retried when idempotent); an
unclaimed step whose message was lost is re-sent by the sweep under the same effect id."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._records import SagaState, StepState
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.dispatcher import Sent
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import HOST, Shop, kinds


def _step_message_pending(shop: Shop, saga_id: str = "o-1") -> Sent:
    """Start the order; return reserve's (undelivered) message."""
    shop.start_order(saga_id)
    [message] = shop.driver.take()
    assert message.step == "shop.reserve"
    return message


# ------------------------------------------------------------ duplicates


def test_a_duplicate_delivered_after_the_commit_does_nothing(shop: Shop) -> None:
    # given
    message = _step_message_pending(shop)
    shop.driver.deliver(message)
    after_first = shop.record()
    shop.driver.take()

    # when
    shop.driver.deliver(message)

    # then
    assert len(shop.script.of("reserve")) == 1
    assert shop.record() == after_first
    assert shop.driver.take() == []


def test_a_duplicate_delivered_while_the_body_runs_does_not_run_the_body(shop: Shop) -> None:
    # given: the duplicate arrives while the first delivery is inside the body
    message = _step_message_pending(shop)

    def duplicate_then_return() -> dict[str, str]:
        shop.driver.deliver(message)
        return {"reservation": "r-1"}

    shop.script.then("reserve", duplicate_then_return)

    # when
    shop.driver.deliver(message)

    # then
    assert len(shop.script.of("reserve")) == 1
    assert shop.step("shop.reserve").state == StepState.COMMITTED
    assert shop.step("shop.reserve").attempts == 1


def test_the_saga_completes_normally_despite_every_message_being_delivered_twice(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    while True:
        batch = shop.driver.take()
        if not batch:
            break
        for message in batch:
            shop.driver.deliver(message)
            shop.driver.deliver(message)

    # then
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_a_message_with_another_effect_id_is_dropped(shop: Shop) -> None:
    # given
    message = _step_message_pending(shop)
    before = shop.record()

    # when
    shop.driver.deliver(Sent("step", "o-1", message.step, "not-the-effect-id"))

    # then
    assert shop.script.calls == []
    assert shop.record() == before
    assert shop.driver.take() == []


def test_a_step_message_carrying_the_compensation_effect_id_is_dropped(shop: Shop) -> None:
    # given
    _step_message_pending(shop)
    step = shop.step("shop.reserve")
    before = shop.record()

    # when
    shop.driver.deliver(Sent("step", "o-1", step.name, step.compensation_effect_id))

    # then
    assert shop.script.calls == []
    assert shop.record() == before


def test_a_compensation_message_for_a_step_not_being_compensated_is_dropped(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.run_until_idle()
    step = shop.step("shop.reserve")
    before = shop.record()

    # when
    shop.driver.deliver(Sent("compensation", "o-1", step.name, step.compensation_effect_id))

    # then
    assert shop.script.of("release") == []
    assert shop.record() == before


def test_a_message_for_an_unknown_saga_is_dropped(shop: Shop) -> None:
    # given
    message = _step_message_pending(shop)

    # when
    shop.sagas.app.tasks["shop.reserve"].push_request(id=message.effect_id)
    try:
        shop.sagas.app.tasks["shop.reserve"](_saga={"id": "no-such-saga", "step": "shop.reserve"})
    finally:
        shop.sagas.app.tasks["shop.reserve"].pop_request()

    # then
    assert shop.script.calls == []


# ------------------------------------------------------------ vanished claimers


def test_a_redelivered_step_whose_claimer_died_is_ambiguous(shop: Shop, dead_pid: int) -> None:
    # given: a worker process claimed the start and was killed
    message = _step_message_pending(shop)
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.reserve")

    # when: the broker redelivers the message
    shop.driver.deliver(message)

    # then
    step = shop.step("shop.reserve")
    assert (step.state, step.error_code) == (StepState.AMBIGUOUS, "worker_lost")
    assert shop.record().state == SagaState.MANUAL_REVIEW
    assert shop.script.calls == []


def test_a_step_claimed_by_a_dead_process_is_never_rerun_when_not_idempotent(
    shop: Shop, dead_pid: int
) -> None:
    # given
    message = _step_message_pending(shop)
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.reserve")

    # when
    shop.driver.deliver(message)
    shop.driver.deliver(message)
    shop.driver.run_until_idle()

    # then
    assert shop.script.calls == []
    assert shop.driver.take() == []


def test_a_redelivered_idempotent_step_whose_claimer_died_reruns_under_the_same_effect_id(
    shop: Shop, dead_pid: int
) -> None:
    # given
    shop.notify_user.start({"user": "ann"}, saga_id="n-1")
    [message] = shop.driver.take()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.notify", "n-1")

    # when
    shop.driver.deliver(message)

    # then
    step = shop.step("shop.notify", "n-1")
    assert (step.state, step.attempts) == (StepState.COMMITTED, 2)
    [call] = shop.script.of("notify")
    assert call.kwargs["saga"].effect_id == step.effect_id == message.effect_id
    assert shop.record("n-1").state == SagaState.COMPLETED


def test_a_claim_by_a_live_process_on_another_host_is_waited_for(shop: Shop) -> None:
    # given: another host's worker is running the step right now
    message = _step_message_pending(shop)
    shop.claim_as("other-host:4242", "shop.reserve")
    before = shop.record()

    # when
    shop.driver.deliver(message)

    # then
    assert shop.script.calls == []
    assert shop.record() == before


def test_the_sweep_marks_a_claimed_step_silent_past_its_time_limit_and_grace_ambiguous(
    shop: Shop,
) -> None:
    # given: ship (time limit 10 s) was claimed on another host and never reported
    shop.start_order()
    for _ in range(2):
        shop.deliver_next()
    shop.driver.take()
    shop.claim_as("other-host:4242", "shop.ship")
    deadline = 10_000 + shop.sagas.settings.timing.grace_ms

    # when
    shop.clock.advance(deadline)
    shop.sagas.sweep()

    # then
    step = shop.step("shop.ship")
    assert (step.state, step.error_code) == (StepState.AMBIGUOUS, "time_limit")
    record = shop.record()
    assert record.state == SagaState.MANUAL_REVIEW
    assert step.effect_id in (record.reason or "")


def test_the_sweep_waits_for_a_claimed_step_until_its_time_limit_and_grace_pass(shop: Shop) -> None:
    # given
    shop.start_order()
    for _ in range(2):
        shop.deliver_next()
    shop.driver.take()
    shop.claim_as("other-host:4242", "shop.ship")
    before = shop.step("shop.ship")
    deadline = 10_000 + shop.sagas.settings.timing.grace_ms

    # when: 1 ms before the deadline (the saga is stale, so the sweep looks at it)
    shop.clock.advance(deadline - 1)
    shop.sagas.sweep()

    # then
    assert shop.step("shop.ship") == before
    assert shop.record().state == SagaState.RUNNING
    assert shop.driver.take() == []


def test_a_late_commit_of_a_step_declared_ambiguous_is_recorded(shop: Shop) -> None:
    # given: the sweep declared ship ambiguous while its body was still running
    shop.start_order()
    for _ in range(2):
        shop.deliver_next()
    [message] = shop.driver.take()

    def outlive_the_deadline() -> dict[str, str]:
        shop.clock.advance(10_000 + shop.sagas.settings.timing.grace_ms)
        shop.sagas.sweep()
        return {"parcel": "late"}

    shop.script.then("ship", outlive_the_deadline)

    # when
    shop.driver.deliver(message)

    # then: the known outcome settles the ambiguity and the saga completes
    assert shop.step("shop.ship").result == {"parcel": "late"}
    assert shop.record().state == SagaState.COMPLETED


# ------------------------------------------------------------ lost messages


def test_the_sweep_resends_a_lost_step_message_under_the_same_effect_id(shop: Shop) -> None:
    # given: reserve's message was lost by the broker
    lost = _step_message_pending(shop)

    # when
    shop.sweep_when_stale()
    sent = shop.driver.take()

    # then
    assert kinds(sent) == [("step", "shop.reserve")]
    assert sent[0].effect_id == lost.effect_id


def test_the_sweep_resends_nothing_before_the_step_is_stale(shop: Shop) -> None:
    # given
    _step_message_pending(shop)

    # when
    shop.clock.advance(shop.sagas.settings.timing.stale_ms - 1)
    shop.sagas.sweep()

    # then
    assert shop.driver.take() == []


def test_a_saga_whose_step_message_was_lost_completes_after_the_sweep(shop: Shop) -> None:
    # given
    _step_message_pending(shop)

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_a_late_original_after_the_resend_runs_the_body_only_once(shop: Shop) -> None:
    # given: the "lost" message was only late; the sweep re-sent it
    late = _step_message_pending(shop)
    shop.sweep_when_stale()
    [resent] = shop.driver.take()

    # when
    shop.driver.deliver(resent)
    shop.driver.deliver(late)
    shop.driver.run_until_idle()

    # then
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_a_resent_step_is_not_resent_again_until_stale_once_more(shop: Shop) -> None:
    # given
    _step_message_pending(shop)
    shop.sweep_when_stale()
    shop.driver.take()

    # when
    shop.clock.advance(shop.sagas.settings.timing.stale_ms - 1)
    shop.sagas.sweep()

    # then
    assert shop.driver.take() == []


def test_the_sweep_resends_a_lost_advance_of_a_fresh_saga(shop: Shop) -> None:
    # given: the advance sent by start was lost
    shop.start_order()
    shop.driver.take()

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPLETED


def test_the_sweep_resends_a_lost_compensation_message_under_the_same_effect_id(shop: Shop) -> None:
    # given: ship was declined and refund's message was lost
    lost = shop.refund_pending()

    # when
    shop.sweep_when_stale()
    sent = shop.driver.take()

    # then
    assert kinds(sent) == [("compensation", "shop.charge")]
    assert sent[0].effect_id == lost.effect_id


# ------------------------------------------------------------ vanished compensators


def test_a_compensator_whose_claimer_died_is_an_ambiguous_compensation(shop: Shop, dead_pid: int) -> None:
    # given
    message = shop.refund_pending()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.charge", compensation=True)

    # when
    shop.driver.deliver(message)

    # then: review names the compensation effect id; nothing else is compensated
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_compensation")
    assert message.effect_id is not None and message.effect_id in (record.reason or "")
    assert shop.script.of("refund") == [] and shop.script.of("release") == []
    assert shop.driver.take() == []


def test_an_idempotent_compensator_whose_claimer_died_is_retried_under_the_same_effect_id(
    shop: Shop, dead_pid: int
) -> None:
    # given: a step whose compensator is safe to repeat
    @shop.sagas.compensator(name="shop.unhold", idempotent=True)
    def unhold(slot: str, *, saga: object = None) -> None:
        shop.script.play("unhold", (slot,), {"saga": saga}, None)

    @shop.sagas.step(name="shop.hold", compensate="shop.unhold")
    def hold(slot: str) -> str:
        return str(shop.script.play("hold", (slot,), {}, f"held-{slot}"))

    @shop.sagas.saga("hold-then-refuse")
    def run(ctx: object, _: object) -> None:
        ctx.step(hold, "s1")  # type: ignore[attr-defined]
        raise StepNotCommitted("changed_mind")

    run.start({}, saga_id="h-1")
    shop.deliver_next()
    [message] = shop.driver.take()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.hold", "h-1", compensation=True)

    # when
    shop.driver.deliver(message)
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.hold", "h-1")
    assert (step.state, step.compensation_attempts) == (StepState.COMPENSATED, 2)
    [call] = shop.script.of("unhold")
    assert call.kwargs["saga"].effect_id == message.effect_id
    assert shop.record("h-1").state == SagaState.COMPENSATED


def test_the_sweep_marks_a_compensator_silent_past_its_time_limit_and_grace_ambiguous(shop: Shop) -> None:
    # given: refund (charge's default time limit) claimed on another host, never reported
    shop.refund_pending()
    shop.claim_as("other-host:4242", "shop.charge", compensation=True)
    timing = shop.sagas.settings.timing
    deadline = timing.default_time_limit_ms + timing.grace_ms

    # when: just before, then at the deadline
    shop.clock.advance(deadline - 1)
    shop.sagas.sweep()
    before_deadline = shop.record().state
    shop.clock.advance(1)
    shop.sagas.sweep()

    # then
    assert before_deadline == SagaState.COMPENSATING
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_compensation")


def test_a_second_sagas_instance_in_the_process_leaves_a_running_delivery_alone() -> None:
    # given: two Sagas on one store in one process (a tasks module imported under two names)
    store, clock, runs = MemoryStore(), FrozenClock(), []
    seen: dict[str, StepState] = {}
    first, second = _pay_sagas(store, clock, runs), _pay_sagas(store, clock, runs)
    first_driver, second_driver = SagaDriver(first[0]), SagaDriver(second[0])
    first[1].start({}, saga_id="x-1")
    [pay] = first_driver.take()

    def duplicate_through_the_second() -> None:
        second_driver.deliver(pay)
        record = second[0].get("x-1")
        assert record is not None
        step = record.step("t.pay")
        assert step is not None
        seen["state"] = step.state

    first[2].append(duplicate_through_the_second)

    # when: the message is delivered again, to the other instance, while the body runs
    first_driver.deliver(pay)

    # then: the duplicate saw a running claim and waited; the body ran once and committed
    assert seen["state"] is StepState.EXECUTING
    assert len(runs) == 1
    record = first[0].get("x-1")
    assert record is not None and record.state is SagaState.COMPLETED


def _pay_sagas(store: MemoryStore, clock: FrozenClock, runs: list[int]
               ) -> tuple[Sagas, Any, list[Callable[[], None]]]:
    """A Sagas with one step, ``t.pay``, whose body calls the hooks appended to the list."""
    app = Celery(f"two-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock)
    hooks: list[Callable[[], None]] = []

    @sagas.step(name="t.pay", compensate=None)
    def pay() -> Any:
        runs.append(1)
        for hook in hooks:
            hook()
        return {"ok": 1}

    @sagas.saga("two-instances")
    def run(ctx: Any, _: Any) -> None:
        ctx.step(pay)

    return sagas, run, hooks
