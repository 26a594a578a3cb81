"""Full jitter on the default backoffs (docs/concepts.md "Retries and backoff"): a retry of a
step or compensator under the default backoff waits a delay drawn from 0 to the backoff's
ceiling, drawn once by the engine when the retry is scheduled and stored as
``next_attempt_at_ms``; a backoff of the definition's own is used as it is."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._protocol.compensation import default_backoff_ms
from celery_sagas._records import StepState
from tests.engine.conftest import CardDeclined, Shop


class Draws:
    """A fixed draw, counted."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.count = 0

    def __call__(self) -> float:
        self.count += 1
        return self.value


def drawing(shop: Shop, draw: Callable[[], float]) -> None:
    """This process's deliveries draw from ``draw`` (they are handed it at construction, so
    the parts are replaced whole)."""
    runtime = shop.sagas._process.current
    runtime.deliveries = replace(runtime.deliveries, draw=draw)


def no_draw() -> float:
    raise AssertionError("a custom backoff must not draw")


def decline_after_reserve(shop: Shop, **policy: Any) -> None:
    """Start a saga that reserves, is declined at charge, and whose release fails once."""
    tasks = shop.tasks

    def run(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        return ctx.step(tasks["charge"], order["card"], order["total"])

    definition = shop.sagas.saga("jittered", **policy)(run)
    shop.script.then("charge", CardDeclined())
    shop.script.then("release", RuntimeError("inventory down"), RuntimeError("inventory down"))
    definition.start({"sku": "sku-1", "qty": 1, "card": "c", "total": 5}, saga_id="j-1")
    shop.driver.run_until_idle()


def test_a_compensation_retry_under_the_default_backoff_waits_the_drawn_part_of_its_ceiling(
        shop: Shop) -> None:
    # given: the engine draws 0.25
    draws = Draws(0.25)
    drawing(shop, draws)

    # when: the first compensator call fails
    decline_after_reserve(shop)

    # then: a quarter of the first ceiling (100 ms), drawn once, stored
    step = shop.step("shop.reserve", "j-1")
    assert step.state is StepState.COMPENSATION_FAILED
    assert step.next_attempt_at_ms == shop.clock.now_ms() + 25
    assert draws.count == 1


def test_the_stored_retry_time_is_read_back_by_sweeps_not_drawn_again(shop: Shop) -> None:
    # given: a compensation retry scheduled with a draw of 0.5
    draws = Draws(0.5)
    drawing(shop, draws)
    decline_after_reserve(shop)
    due = shop.step("shop.reserve", "j-1").next_attempt_at_ms
    assert due == shop.clock.now_ms() + 50

    # when: sweeps run before it is due
    shop.clock.advance(49)
    shop.sagas.sweep()
    shop.sagas.sweep()

    # then: nothing moved and nothing was drawn
    assert shop.driver.take() == []
    assert shop.step("shop.reserve", "j-1").next_attempt_at_ms == due
    assert draws.count == 1

    # when: it is due, the sweep sends the retry, which fails again
    shop.clock.advance(1)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then: the second retry is drawn against the second ceiling (200 ms)
    step = shop.step("shop.reserve", "j-1")
    assert step.compensation_attempts == 2
    assert step.next_attempt_at_ms == shop.clock.now_ms() + 100
    assert draws.count == 2


def test_a_backoff_of_the_definitions_own_is_not_jittered(shop: Shop) -> None:
    # given
    drawing(shop, no_draw)

    # when
    decline_after_reserve(shop, backoff=lambda attempt: 0.7)  # seconds

    # then
    assert shop.step("shop.reserve", "j-1").next_attempt_at_ms == shop.clock.now_ms() + 700


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999999])
def test_a_forward_retry_under_the_default_backoff_waits_the_drawn_part_of_its_ceiling(
        shop: Shop, monkeypatch: pytest.MonkeyPatch, draw: float) -> None:
    # given: an idempotent step under the default backoff that fails once
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    drawing(shop, Draws(draw))

    @shop.sagas.step(name="shop.ping", compensate=None, idempotent=True, retries=2)
    def ping(*, saga: Any = None) -> Any:
        return shop.script.play("ping", (), {}, "pong")

    @shop.sagas.saga("ping")
    def run(ctx: Any, data: Any) -> Any:
        return ctx.step(ping)

    shop.script.then("ping", ConnectionError("flaky"))

    # when
    run.start({}, saga_id="p-1")
    shop.driver.run_until_idle()

    # then: the retry (run within the delivery) waited the drawn part of 100 ms
    assert shop.record("p-1").state == "completed"
    assert slept == [int(100 * draw) / 1000]
    assert len(shop.script.of("ping")) == 2


def test_jittered_delays_spread_over_the_whole_range(shop: Shop) -> None:
    # given: the engine's own random draws
    delays = []
    for n in range(40):
        saga_id = f"s-{n}"
        shop.script.then("release", RuntimeError("down"))
        shop.script.then("charge", CardDeclined())
        shop.place_order.start({"id": saga_id, "sku": "s", "qty": 1, "card": "c", "total": 1},
                               saga_id=saga_id)
        shop.driver.run_until_idle()
        step = shop.step("shop.reserve", saga_id)
        if step.state is StepState.COMPENSATED:  # drew 0: retried at once, in the same delivery
            delays.append(0)
        else:
            delays.append(step.next_attempt_at_ms - shop.clock.now_ms())

    # then: within 0..100 ms and not all alike (sagas that failed together do not retry together)
    assert all(0 <= d <= default_backoff_ms(1) for d in delays)
    assert len(set(delays)) > 10
