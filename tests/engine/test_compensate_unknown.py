"""``compensate_unknown=True``: a step whose outcome is unknown is compensated instead of
sent to manual review, and every compensator learns what it undoes and why (issue 29 items
1 and 3)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas import CompensationReason, StepNotCommitted
from celery_sagas._records import EffectState, SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import HOST, Shop


def _label_saga(shop: Shop, **options: Any) -> Any:
    """reserve, then ``t.label`` (declared with ``options``, compensated by ``t.cancel``)."""
    reserve = shop.tasks["reserve"]

    @shop.sagas.compensator(name="t.cancel")
    def cancel(order_id: str, *, result: Any = None, saga: Any = None) -> None:
        shop.script.play("cancel", (order_id,), {"result": result, "saga": saga}, None)

    @shop.sagas.step(name="t.label", compensate="t.cancel", **options)
    def label(order_id: str) -> Any:
        return shop.script.play("label", (order_id,), {}, {"label": order_id})

    @shop.sagas.saga("label")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        label_ = ctx.step(label, data["id"])
        if data.get("refuse"):
            raise StepNotCommitted("over_budget")
        return label_

    return run


def test_an_unknown_outcome_is_compensated_when_declared(shop: Shop) -> None:
    # given: a label step declared compensate_unknown whose body raises something undeclared
    definition = _label_saga(shop, compensate_unknown=True)
    shop.script.then("label", ConnectionError("reset after the request left"))

    # when
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.driver.run_until_idle()

    # then: compensated (label cancelled, then the reservation released), not in review
    record = shop.record("u-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "step_error")
    assert "outcome unknown" in (record.reason or "")
    assert shop.script.names() == ["reserve", "label", "cancel", "release"]
    step = shop.step("t.label", "u-1")
    assert (step.state, step.outcome_unknown) == (StepState.COMPENSATED, True)
    assert step.execution is not None and step.execution.state is EffectState.UNKNOWN
    # the compensator was told the outcome is unknown, and there is no result to undo
    [cancel] = shop.script.of("cancel")
    ctx = cancel.kwargs["saga"]
    assert (ctx.outcome, cancel.kwargs["result"]) == ("unknown", None)
    assert ctx.forward_effect_id == step.effect_id
    assert ctx.reason == CompensationReason("step_error", "t.label")
    assert ctx.input == {"id": "o-7"}
    # the earlier step's compensator sees a committed outcome and the same reason
    [release] = shop.script.of("release")
    assert release.kwargs["saga"].outcome == "committed"
    assert release.kwargs["saga"].reason == CompensationReason("step_error", "t.label")


def test_without_the_option_an_unknown_outcome_still_goes_to_review(shop: Shop) -> None:
    definition = _label_saga(shop)
    shop.script.then("label", ConnectionError("reset"))
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.driver.run_until_idle()
    assert shop.record("u-1").state == SagaState.MANUAL_REVIEW
    assert shop.step("t.label", "u-1").state == StepState.AMBIGUOUS
    assert "cancel" not in shop.script.names()


def test_a_vanished_attempt_is_compensated_once_when_declared(shop: Shop, dead_pid: int) -> None:
    # given: the label step's attempt was claimed by a process now dead
    definition = _label_saga(shop, compensate_unknown=True)
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.deliver_next()  # reserve
    [message] = shop.driver.take()
    shop.claim_as(f"{HOST}:{dead_pid}/x", "t.label", "u-1")

    # when: the broker requeues the message (the worker was lost)
    shop.driver.deliver(message)
    shop.driver.run_until_idle()

    # then: the body never ran again, its compensator ran once
    assert "label" not in shop.script.names()
    assert shop.script.names().count("cancel") == 1
    record = shop.record("u-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "worker_lost")


def test_a_step_silent_past_its_time_limit_is_compensated_when_declared(shop: Shop) -> None:
    # given: the label step (time limit 10 s) was claimed on another host and never reported
    definition = _label_saga(shop, compensate_unknown=True, time_limit=10)
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.deliver_next()  # reserve
    shop.driver.take()  # the label's message, taken by the silent host
    shop.claim_as("other-host:4242", "t.label", "u-1")

    # when: the sweep runs past the time limit and its grace
    shop.clock.advance(10_000 + shop.sagas.settings.timing.grace_ms)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then: compensated (not in review), the label cancelled once, told the outcome is unknown
    record = shop.record("u-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "time_limit")
    assert "label" not in shop.script.names()
    [cancel] = shop.script.of("cancel")
    assert cancel.kwargs["saga"].outcome == "unknown"
    assert cancel.kwargs["saga"].reason == CompensationReason("time_limit", "t.label")


def test_an_idempotent_step_whose_retries_ran_out_is_compensated_when_declared(
        shop: Shop) -> None:
    # given: an idempotent label step (1 retry) whose every attempt raises something undeclared
    definition = _label_saga(shop, compensate_unknown=True, idempotent=True, retries=1,
                             backoff=lambda _: 0)
    shop.script.then("label", ConnectionError("reset"), ConnectionError("reset"))

    # when
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.driver.run_until_idle()

    # then: both attempts ran, then the label was cancelled once as unknown, not reviewed
    record = shop.record("u-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "step_error")
    step = shop.step("t.label", "u-1")
    assert (step.state, step.attempts, step.outcome_unknown) == (
        StepState.COMPENSATED, 2, True)
    assert shop.script.names() == ["reserve", "label", "label", "cancel", "release"]
    assert shop.script.of("cancel")[0].kwargs["saga"].outcome == "unknown"


def test_a_refusal_in_run_gives_compensators_no_step(shop: Shop) -> None:
    definition = _label_saga(shop, compensate_unknown=True)
    definition.start({"id": "o-7", "refuse": True}, saga_id="u-1")
    shop.driver.run_until_idle()
    [cancel] = shop.script.of("cancel")
    ctx = cancel.kwargs["saga"]
    assert (ctx.outcome, ctx.reason) == ("committed", CompensationReason("over_budget"))
    assert str(ctx.reason) == "over_budget"


def test_a_cancelled_saga_tells_its_compensators(shop: Shop) -> None:
    shop.start_order()
    shop.deliver_next()  # reserve committed
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()
    [release] = shop.script.of("release")
    assert release.kwargs["saga"].reason == CompensationReason("cancelled")
    assert str(release.kwargs["saga"].reason) == "cancelled"


def test_compensate_unknown_needs_a_compensator_and_a_bool(shop: Shop) -> None:
    with pytest.raises(SagaConfigurationError, match="needs a compensator"):
        shop.sagas.step(name="t.none", compensate=None, compensate_unknown=True)(lambda: None)
    with pytest.raises(SagaConfigurationError, match="True or False"):
        shop.sagas.step(name="t.odd", compensate="t.x", compensate_unknown="yes")(lambda: None)
    assert "t.none" not in shop.sagas.registry.steps and "t.odd" not in shop.sagas.registry.steps


def test_the_history_records_the_unknown_outcome_before_the_compensation(shop: Shop) -> None:
    definition = _label_saga(shop, compensate_unknown=True)
    shop.script.then("label", ConnectionError("reset"))
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.driver.run_until_idle()
    entries = [(str(e.event), e.step, e.code) for e in shop.sagas.history("u-1").entries]
    assert ("ambiguous", "t.label", "step_error") in entries
    assert ("committed", "t.label", None) not in entries
    assert ("compensated", "t.label", None) in entries


def test_show_says_the_outcome_was_unknown(shop: Shop) -> None:
    from celery_sagas import _cli_format as fmt

    definition = _label_saga(shop, compensate_unknown=True)
    shop.script.then("label", ConnectionError("reset"))
    definition.start({"id": "o-7"}, saga_id="u-1")
    shop.driver.run_until_idle()
    record = shop.record("u-1")
    step = shop.step("t.label", "u-1")
    assert fmt.step_view(step)["outcome_unknown"] is True
    assert fmt.step_view(record.steps[0])["outcome_unknown"] is False
    assert "outcome unknown: compensated as declared" in fmt.saga_text(record)
