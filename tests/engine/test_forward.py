"""Forward execution: intent first, one claim per step, results recorded,
and the continuation to the next step costs no extra broker message."""

from __future__ import annotations

from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import ORDER, Shop, kinds


def test_start_records_the_first_step_with_the_saga_and_sends_it(shop: Shop) -> None:
    # when
    started = shop.start_order()

    # then: one create holds the saga and its first step's intent; that step is sent at once
    assert started.state == "running" and started.version == 1
    assert [(s.name, s.state, s.attempts) for s in started.steps] == [
        ("shop.reserve", StepState.EXECUTING, 0)]
    assert shop.record() == started
    assert shop.record().input == ORDER
    sent = shop.driver.take()
    assert kinds(sent) == [("step", "shop.reserve")]
    assert sent[0].version == 1
    assert shop.script.calls == []


def test_steps_run_in_order_and_the_saga_completes(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert record.state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]
    assert [s.name for s in record.steps] == ["shop.reserve", "shop.charge", "shop.ship"]
    assert all(s.state == StepState.COMMITTED and s.attempts == 1 for s in record.steps)


def test_each_step_result_is_recorded_and_feeds_later_steps(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.step("shop.reserve").result == {"reservation": "r-sku-1"}
    assert shop.step("shop.charge").result == {"charge": "ch-card-1"}
    assert shop.step("shop.ship").result == {"parcel": "p-o-1"}
    assert shop.script.of("ship")[0].args == ("o-1", "r-sku-1")


def test_step_args_and_kwargs_are_recorded_and_passed_to_the_body(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    reserve = shop.step("shop.reserve")
    assert (reserve.args, dict(reserve.kwargs)) == (("sku-1", 2), {"warehouse": "east"})
    call = shop.script.of("reserve")[0]
    assert call.args == ("sku-1", 2) and call.kwargs["warehouse"] == "east"


def test_exactly_one_message_per_step(shop: Shop) -> None:
    # given
    shop.start_order()

    # when: deliver batch by batch, recording what each delivery caused
    batches = []
    while True:
        delivered = shop.deliver_next()
        if not delivered:
            break
        batches.append(kinds(delivered))

    # then: start sends the first step; the continuation after each commit sends the next
    assert batches == [
        [("step", "shop.reserve")],
        [("step", "shop.charge")],
        [("step", "shop.ship")],
    ]
    assert shop.record().state == SagaState.COMPLETED


def test_intent_is_recorded_before_the_step_message_is_sent(shop: Shop) -> None:
    # given
    # when
    shop.start_order()
    sent = shop.driver.take()

    # then: the message names the effect id already stored as "executing", not yet claimed
    step = shop.step("shop.reserve")
    assert kinds(sent) == [("step", "shop.reserve")]
    assert sent[0].effect_id == step.effect_id
    assert step.state == StepState.EXECUTING
    assert step.attempts == 0 and step.started_at_ms is None


def test_each_step_gets_fresh_distinct_effect_ids(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    ids = [i for s in shop.record().steps for i in (s.effect_id, s.compensation_effect_id)]
    assert len(ids) == 6 and len(set(ids)) == 6


def test_the_step_body_receives_a_context_with_the_effect_id_as_idempotency_key(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.driver.run_until_idle()

    # then
    ctx = shop.script.of("charge")[0].kwargs["saga"]
    step = shop.step("shop.charge")
    assert (ctx.saga_id, ctx.step, ctx.effect_id, ctx.attempt) == ("o-1", "shop.charge", step.effect_id, 1)
    assert ctx.idempotency_key == step.effect_id
    assert ctx.stage == "execution"


def test_a_completed_saga_sends_nothing_more_when_advanced_again(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.run_until_idle()
    before = shop.record()

    # when
    shop.sagas.engine.advance("o-1")

    # then
    assert shop.record() == before
    assert shop.driver.take() == []
