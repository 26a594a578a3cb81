"""Replay: run(ctx, input) is called from the top on every advance and must ask for
the recorded steps again; anything else is non-determinism, sent to manual review. Errors in
run() itself become decisions, never crashed workers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import Shop

# Module-level state a careless run() depends on: flipping it between replays changes the steps.
SECOND_STEP = {"name": "charge"}


@pytest.fixture(autouse=True)
def _reset_flag() -> Iterator[None]:
    SECOND_STEP["name"] = "charge"
    yield
    SECOND_STEP["name"] = "charge"


def _define_flagged(shop: Shop) -> Any:
    tasks = shop.tasks

    @shop.sagas.saga("flagged")
    def run(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        if SECOND_STEP["name"] == "charge":
            ctx.step(tasks["charge"], order["card"], order["total"])
        else:
            ctx.step(tasks["ship"], order["id"], "r-1")
        return ctx.step(tasks["notify"], "ann")

    return run


ORDER = {"id": "o-1", "sku": "sku-1", "qty": 1, "card": "c", "total": 5}


def _charge_pending(shop: Shop, definition: Any) -> None:
    """Start, deliver the advance and reserve; charge's message is pending."""
    definition.start(ORDER, saga_id="f-1")
    shop.deliver_next()
    assert shop.record("f-1").steps[-1].name == "shop.charge"


def test_a_replay_asking_for_another_step_than_recorded_goes_to_manual_review(shop: Shop) -> None:
    # given
    definition = _define_flagged(shop)
    _charge_pending(shop, definition)
    SECOND_STEP["name"] = "ship"

    # when: charge commits and the continuation replays run()
    shop.driver.run_until_idle()

    # then
    record = shop.record("f-1")
    assert record.state == SagaState.MANUAL_REVIEW
    assert record.error_code == "nondeterministic"
    assert "shop.charge" in (record.reason or "")


def test_a_nondeterministic_replay_dispatches_nothing_and_compensates_nothing(shop: Shop) -> None:
    # given
    definition = _define_flagged(shop)
    _charge_pending(shop, definition)
    SECOND_STEP["name"] = "ship"

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.script.names() == ["reserve", "charge"]
    assert [s.state for s in shop.record("f-1").steps] == [StepState.COMMITTED, StepState.COMMITTED]
    assert shop.driver.take() == []


def test_a_replay_asking_for_a_recorded_step_with_other_arguments_is_nondeterministic(
    shop: Shop,
) -> None:
    # given
    tasks = shop.tasks
    price = {"total": 5}

    @shop.sagas.saga("priced")
    def run(ctx: Any, _: Any) -> Any:
        ctx.step(tasks["charge"], "c", price["total"])
        return ctx.step(tasks["notify"], "ann")

    run.start({}, saga_id="f-1")
    price["total"] = 6

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").error_code == "nondeterministic"


def test_a_run_returning_before_a_recorded_step_is_nondeterministic(shop: Shop) -> None:
    # given
    tasks = shop.tasks
    short = {"value": False}

    @shop.sagas.saga("shortened")
    def run(ctx: Any, _: Any) -> Any:
        ctx.step(tasks["reserve"], "sku-1", 1)
        if short["value"]:
            return None
        return ctx.step(tasks["notify"], "ann")

    run.start({}, saga_id="f-1")
    shop.deliver_next()  # reserve commits, notify recorded
    short["value"] = True

    # when
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").error_code == "nondeterministic"


def test_a_recorded_step_whose_definition_lost_its_compensator_is_nondeterministic(
    shop: Shop,
) -> None:
    # given: charge recorded with compensator shop.refund; then the code changed
    _charge_pending(shop, _define_flagged(shop))
    registry = shop.sagas.registry
    registry.add_step(replace(registry.step("shop.charge"), compensator=None))

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record("f-1")
    assert record.error_code == "nondeterministic"
    assert "compensator" in (record.reason or "")


def test_a_plain_exception_in_run_goes_to_manual_review_run_failed(shop: Shop) -> None:
    # given
    tasks = shop.tasks

    @shop.sagas.saga("buggy")
    def run(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        raise KeyError("oops")

    # when
    run.start(ORDER, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "run_failed")
    assert "KeyError" in (record.reason or "")
    assert shop.script.names() == ["reserve"]


def test_an_exception_in_run_before_any_step_goes_to_manual_review(shop: Shop) -> None:
    # given
    @shop.sagas.saga("broken")
    def run(ctx: Any, order: dict[str, Any]) -> Any:
        return order["missing"]

    # when
    run.start(ORDER, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").error_code == "run_failed"


def test_step_not_committed_raised_by_run_compensates_what_committed(shop: Shop) -> None:
    # given
    tasks = shop.tasks

    @shop.sagas.saga("refusing")
    def run(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(tasks["reserve"], order["sku"], order["qty"])
        if stock["reservation"]:
            raise StepNotCommitted("over_budget")
        return stock

    # when
    run.start(ORDER, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record("f-1")
    assert record.state == SagaState.COMPENSATED
    assert record.error_code == "over_budget"
    assert shop.script.names() == ["reserve", "release"]


def test_a_step_call_with_an_unregistered_task_goes_to_manual_review(shop: Shop) -> None:
    # given
    @shop.sagas.saga("misused")
    def run(ctx: Any, _: Any) -> Any:
        return ctx.step(print, "hello")

    # when
    run.start({}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").error_code == "invalid_step_call"
    assert shop.record("f-1").steps == ()


def test_a_step_call_with_non_json_arguments_goes_to_manual_review(shop: Shop) -> None:
    # given
    tasks = shop.tasks

    @shop.sagas.saga("bad-args")
    def run(ctx: Any, _: Any) -> Any:
        return ctx.step(tasks["notify"], {"a", "set"})

    # when
    run.start({}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").error_code == "invalid_step_call"
    assert shop.script.calls == []


def test_run_catching_everything_cannot_swallow_the_replay_suspension(shop: Shop) -> None:
    # given: a run() that wraps its step in a broad except
    tasks = shop.tasks

    @shop.sagas.saga("catch-all")
    def run(ctx: Any, _: Any) -> Any:
        try:
            return ctx.step(tasks["notify"], "ann")
        except Exception:
            return "swallowed"

    # when
    run.start({}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").state == SagaState.COMPLETED
    assert shop.script.names() == ["notify"]


def test_a_step_used_twice_gets_a_distinct_name_per_call(shop: Shop) -> None:
    # given
    tasks = shop.tasks

    @shop.sagas.saga("twice")
    def run(ctx: Any, _: Any) -> Any:
        ctx.step(tasks["notify"], "ann")
        return ctx.step(tasks["notify"], "bob")

    # when
    run.start({}, saga_id="f-1")
    shop.driver.run_until_idle()

    # then
    assert [s.name for s in shop.record("f-1").steps] == ["shop.notify", "shop.notify#2"]
    assert shop.record("f-1").state == SagaState.COMPLETED
