"""Cancellation: a running saga stops at the next step boundary and
compensates what committed; a step in flight is waited for; a final saga is left as it is."""

from __future__ import annotations

import pytest

from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaResolutionError
from tests.engine.conftest import Shop, kinds


def _reserve_committed_charge_pending(shop: Shop) -> None:
    shop.start_order()
    shop.deliver_next()  # reserve commits; charge's message is now pending
    assert shop.step("shop.charge").attempts == 0


def test_cancel_between_steps_compensates_what_committed(shop: Shop) -> None:
    # given
    _reserve_committed_charge_pending(shop)

    # when
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert record.state == SagaState.COMPENSATED
    assert record.error_code == "cancelled"
    assert shop.step("shop.reserve").state == StepState.COMPENSATED


def test_cancel_abandons_an_unclaimed_step_whose_body_then_never_runs(shop: Shop) -> None:
    # given
    _reserve_committed_charge_pending(shop)

    # when: the charge message is delivered after the cancel
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then
    charge = shop.step("shop.charge")
    assert (charge.state, charge.error_code) == (StepState.FAILED, "not_started")
    assert shop.script.names() == ["reserve", "release"]


def test_cancel_returns_the_compensating_saga_and_sends_the_compensator(shop: Shop) -> None:
    # given
    _reserve_committed_charge_pending(shop)
    shop.driver.take()  # the charge message is lost anyway

    # when
    returned = shop.sagas.cancel("o-1")

    # then
    assert returned.state == SagaState.COMPENSATING
    assert kinds(shop.driver.take()) == [("compensation", "shop.reserve")]


def test_cancel_before_any_step_ends_compensated_and_runs_nothing(shop: Shop) -> None:
    # given
    shop.start_order()

    # when: the advance sent by start arrives after the cancel
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.calls == []


def test_cancel_while_a_step_runs_waits_for_it_and_then_undoes_it_too(shop: Shop) -> None:
    # given: the operator cancels while charge's body is running
    _reserve_committed_charge_pending(shop)
    seen: dict[str, object] = {}

    def cancel_midway() -> dict[str, str]:
        seen["state"] = shop.sagas.cancel("o-1").state
        seen["sent"] = shop.driver.take()
        return {"charge": "ch-1"}

    shop.script.then("charge", cancel_midway)

    # when
    shop.driver.run_until_idle()

    # then: nothing was compensated while charge ran; afterwards both are undone, newest first
    assert seen == {"state": SagaState.COMPENSATING, "sent": []}
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "charge", "refund", "release"]


def test_cancel_of_a_completed_saga_is_a_no_op_that_returns_it(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.run_until_idle()
    before = shop.record()

    # when
    returned = shop.sagas.cancel("o-1")

    # then
    assert returned == before == shop.record()
    assert returned.state == SagaState.COMPLETED
    assert shop.driver.take() == []


def test_cancel_of_a_compensated_saga_is_a_no_op_that_returns_it(shop: Shop) -> None:
    # given
    _reserve_committed_charge_pending(shop)
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()
    before = shop.record()

    # when
    returned = shop.sagas.cancel("o-1")

    # then
    assert returned == before == shop.record()
    assert shop.driver.take() == []


def test_cancel_twice_compensates_once(shop: Shop) -> None:
    # given
    _reserve_committed_charge_pending(shop)

    # when
    shop.sagas.cancel("o-1")
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then
    assert shop.script.names() == ["reserve", "release"]


def test_cancel_with_an_unknown_outcome_is_refused(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()
    shop.driver.run_until_idle()
    before = shop.record()

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.cancel("o-1")
    assert shop.record() == before


def test_cancel_of_a_saga_in_review_with_known_outcomes_compensates_it(shop: Shop) -> None:
    # given: run() crashed after reserve committed
    tasks = shop.tasks

    @shop.sagas.saga("crashing")
    def run(ctx: object, _: object) -> None:
        ctx.step(tasks["reserve"], "sku-1", 1)  # type: ignore[attr-defined]
        raise RuntimeError("bug")

    run.start({}, saga_id="c-1")
    shop.driver.run_until_idle()
    assert shop.record("c-1").error_code == "run_failed"

    # when
    shop.sagas.cancel("c-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("c-1").state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "release"]
