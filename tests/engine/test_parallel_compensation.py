"""``@sagas.saga(name, compensation="parallel")``: every committed step's compensator is sent
at once; retries, exhaustion and review stay per compensator (issue 29 item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._protocol import codes
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import Shop, kinds


def _trip(shop: Shop, **options: Any) -> Any:
    """reserve, charge, book (each with a compensator), then ship (the script may decline)."""
    reserve, charge, ship = shop.tasks["reserve"], shop.tasks["charge"], shop.tasks["ship"]

    @shop.sagas.compensator(name="t.unbook")
    def unbook(hotel: str, *, saga: Any = None) -> None:
        shop.script.play("unbook", (hotel,), {"saga": saga}, None)

    @shop.sagas.step(name="t.book", compensate="t.unbook")
    def book(hotel: str) -> Any:
        return shop.script.play("book", (hotel,), {}, {"booked": hotel})

    @shop.sagas.saga("trip", **options)
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        stock = ctx.step(reserve, "sku-1", 1)
        ctx.step(charge, "card-1", 30)
        ctx.step(book, "h-1")
        return ctx.step(ship, data["id"], stock["reservation"])

    return run


def _declined_trip(shop: Shop, **options: Any) -> None:
    definition = _trip(shop, compensation="parallel", **options)
    shop.script.then("ship", StepNotCommitted("no_courier"))
    definition.start({"id": "o-1"}, saga_id="t-1")
    for _ in range(4):  # reserve, charge, book, ship (declined)
        shop.deliver_next()


def test_every_compensator_is_sent_at_once(shop: Shop) -> None:
    # when: the last step declines
    _declined_trip(shop)

    # then: the three compensators are all pending before any of them ran
    pending = shop.driver.take()
    assert sorted(kinds(pending)) == [("compensation", "shop.charge"),
                                      ("compensation", "shop.reserve"),
                                      ("compensation", "t.book")]
    assert [s.state for s in shop.record("t-1").steps[:3]] == [StepState.COMPENSATING] * 3
    for message in pending:
        shop.driver.deliver(message)
    record = shop.record("t-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "no_courier")


def test_a_failing_compensator_is_retried_alone(shop: Shop) -> None:
    # given: the hotel's cancellation fails once
    shop.script.then("unbook", ConnectionError("hotel down"))
    _declined_trip(shop, backoff=lambda _: 0)

    # when
    shop.driver.run_until_idle()
    shop.clock.advance(1)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then: retried and done; the others ran once
    assert shop.script.names().count("unbook") == 2
    assert shop.script.names().count("refund") == 1 and shop.script.names().count("release") == 1
    assert shop.record("t-1").state == SagaState.COMPENSATED


def test_an_exhausted_compensator_goes_to_review_after_the_others(shop: Shop) -> None:
    shop.script.then("unbook", *(ConnectionError("hotel down") for _ in range(3)))
    _declined_trip(shop, backoff=lambda _: 0)
    for _ in range(5):
        shop.driver.run_until_idle()
        shop.clock.advance(1)
        shop.sagas.sweep()
    record = shop.record("t-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW,
                                                 codes.COMPENSATION_EXHAUSTED)
    states = {s.name: s.state for s in record.steps}
    assert states["shop.reserve"] == states["shop.charge"] == StepState.COMPENSATED
    assert states["t.book"] == StepState.COMPENSATION_FAILED


def test_reverse_stays_the_default_one_at_a_time(shop: Shop) -> None:
    definition = _trip(shop)
    shop.script.then("ship", StepNotCommitted("no_courier"))
    definition.start({"id": "o-1"}, saga_id="t-1")
    for _ in range(4):
        shop.deliver_next()
    assert kinds(shop.driver.take()) == [("compensation", "t.book")]


def test_an_unknown_compensation_order_is_refused(shop: Shop) -> None:
    with pytest.raises(SagaConfigurationError, match="reverse, parallel"):
        shop.sagas.saga("odd", compensation="random")(lambda ctx, data: None)
    assert "odd" not in shop.sagas.registry.definitions
