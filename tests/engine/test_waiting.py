"""Durable timers and signals in the engine (docs/design.md §3.4, §3.5): a waiting step holds
the saga without a task; the sweep's due pass wakes a timer; a signal wakes a wait at once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_sagas import SignalTimeout
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import PayloadTooLarge, SagaAlreadyFinal, SagaNotFound, SagaValidationError
from tests.engine.conftest import Shop, kinds, nothing_stored


def _define(shop: Shop, name: str, run: Any) -> Any:
    return shop.sagas.saga(name)(run)


def _sleeper(shop: Shop, seconds: float = 60) -> Any:
    reserve, charge = shop.tasks["reserve"], shop.tasks["charge"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        ctx.sleep(seconds)
        return ctx.step(charge, "card-1", 10)

    return _define(shop, "sleeper", run)


def _waiter(shop: Shop, timeout: float | None = None, catch: bool = False) -> Any:
    reserve, charge, ship = shop.tasks["reserve"], shop.tasks["charge"], shop.tasks["ship"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        try:
            got = ctx.wait_signal("paid", timeout=timeout)
        except SignalTimeout:
            if not catch:
                raise
            return ctx.step(ship, "late", "none")
        return ctx.step(charge, "card-1", got["amount"])

    return _define(shop, "waiter", run)


# ---------------------------------------------------------------- timers


def test_a_sleep_parks_the_saga_with_its_wake_up_as_the_due_time(shop: Shop) -> None:
    # given
    _sleeper(shop).start({}, saga_id="s-1")

    # when
    shop.driver.run_until_idle()

    # then: nothing is queued; the record is due at the wake-up
    record = shop.record("s-1")
    timer = record.steps[1]
    assert (timer.name, timer.state) == ("sleep", StepState.WAITING)
    assert timer.wake_at_ms == timer_start(shop, "s-1") + 60_000
    assert shop.driver.take() == []
    assert shop.sagas.store.get("saga", "s-1").due_at_ms == timer.wake_at_ms  # type: ignore[union-attr]


def timer_start(shop: Shop, saga_id: str) -> int:
    committed = shop.record(saga_id).steps[0].committed_at_ms
    assert committed is not None
    return committed


def test_a_sweep_before_the_wake_up_leaves_the_timer_alone(shop: Shop) -> None:
    # given
    _sleeper(shop).start({}, saga_id="s-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(59_000)
    shop.sagas.sweep()

    # then
    assert shop.record("s-1").steps[1].state == StepState.WAITING
    assert shop.driver.take() == []


def test_the_sweep_after_the_wake_up_fires_the_timer_and_the_saga_goes_on(shop: Shop) -> None:
    # given
    _sleeper(shop).start({}, saga_id="s-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    record = shop.record("s-1")
    assert record.state == SagaState.COMPLETED
    assert [s.state for s in record.steps] == [StepState.COMMITTED] * 3
    assert shop.script.names() == ["reserve", "charge"]
    assert shop.sagas.store.get("saga", "s-1").due_at_ms is None  # type: ignore[union-attr]


def test_a_fired_timer_returns_at_once_on_replay_under_a_later_clock(shop: Shop) -> None:
    # given: the timer fired, charge is in flight
    _sleeper(shop).start({}, saga_id="s-1")
    shop.driver.run_until_idle()
    shop.clock.advance(60_000)
    shop.sagas.sweep()

    # when: much later the charge commits and the replay passes the timer again
    shop.clock.advance(3_600_000)
    shop.driver.run_until_idle()

    # then
    assert shop.record("s-1").state == SagaState.COMPLETED
    assert len(shop.record("s-1").steps) == 3


def test_sleep_until_an_aware_datetime_wakes_then(shop: Shop) -> None:
    # given
    wake = datetime.fromtimestamp(shop.clock.now_ms() / 1000, tz=timezone.utc) + timedelta(hours=2)
    charge = shop.tasks["charge"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep_until(datetime.fromisoformat(data["at"]))
        return ctx.step(charge, "card-1", 1)

    _define(shop, "until", run).start({"at": wake.isoformat()}, saga_id="u-1")

    # when
    shop.clock.advance(2 * 3_600_000 - 1)
    shop.sagas.sweep()
    early = shop.record("u-1").steps[0].state
    shop.clock.advance(1)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert early == StepState.WAITING
    assert shop.record("u-1").state == SagaState.COMPLETED


def test_a_run_that_starts_with_a_sleep_creates_the_saga_parked(shop: Shop) -> None:
    # given
    charge = shop.tasks["charge"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep(5)
        return ctx.step(charge, "card-1", 1)

    # when
    record = _define(shop, "later", run).start({}, saga_id="l-1").record

    # then
    assert [s.state for s in record.steps] == [StepState.WAITING]
    assert shop.driver.take() == []


def test_cancel_during_a_sleep_compensates_at_once(shop: Shop) -> None:
    # given
    _sleeper(shop).start({}, saga_id="s-1")
    shop.driver.run_until_idle()

    # when
    shop.sagas.cancel("s-1")
    shop.driver.run_until_idle()

    # then: no sweep, no waiting: the timer is abandoned and reserve undone
    record = shop.record("s-1")
    assert record.state == SagaState.COMPENSATED
    assert (record.steps[1].state, record.steps[1].error_code) == (StepState.FAILED, "not_started")
    assert shop.script.names() == ["reserve", "release"]


@pytest.mark.parametrize("seconds", [-1, float("nan"), "5", True, 10**9])
def test_a_bad_sleep_sends_the_saga_to_review_and_records_no_timer(shop: Shop, seconds: Any) -> None:
    # given
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep(seconds)

    # when
    record = _define(shop, "bad-sleep", run).start({}, saga_id="b-1").record

    # then
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert record.steps == ()


def test_a_naive_datetime_is_refused(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep_until(datetime(2030, 1, 1))

    # when
    record = _define(shop, "naive", run).start({}, saga_id="n-1").record

    # then
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")


# ---------------------------------------------------------------- signals


def test_a_signal_sent_after_the_wait_wakes_the_saga_at_once(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    shop.driver.run_until_idle()
    assert shop.record("w-1").steps[1].state == StepState.WAITING

    # when
    returned = shop.sagas.signal("w-1", "paid", {"amount": 42})

    # then: the wait committed and charge was sent by the signalling call itself
    assert returned.steps[1].state == StepState.COMMITTED
    assert kinds(shop.driver.take()) == [("step", "shop.charge")]
    assert returned.signals[0].consumed_by == "signal:paid"


def test_a_signal_sent_before_the_wait_is_received_when_the_wait_comes(shop: Shop) -> None:
    # given: the signal arrives while reserve is still queued
    _waiter(shop).start({}, saga_id="w-1")
    shop.sagas.signal("w-1", "paid", {"amount": 7})

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record("w-1")
    assert record.state == SagaState.COMPLETED
    assert shop.script.of("charge")[0].args == ("card-1", 7)


def test_a_signal_id_sent_twice_is_one_signal(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")

    # when
    shop.sagas.signal("w-1", "paid", {"amount": 1}, signal_id="hook-1")
    shop.sagas.signal("w-1", "paid", {"amount": 2}, signal_id="hook-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record("w-1")
    assert [(s.signal_id, s.payload) for s in record.signals] == [("hook-1", {"amount": 1})]
    assert shop.script.of("charge")[0].args == ("card-1", 1)


def test_two_waits_of_one_name_take_two_signals_in_order(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        return [ctx.wait_signal("tick"), ctx.wait_signal("tick")]

    _define(shop, "ticks", run).start({}, saga_id="t-1")

    # when
    shop.sagas.signal("t-1", "tick", 1)
    shop.sagas.signal("t-1", "tick", 2)

    # then
    record = shop.record("t-1")
    assert record.state == SagaState.COMPLETED
    assert [s.result["payload"] for s in record.steps] == [1, 2]


def test_a_signal_of_another_name_leaves_the_wait_waiting(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    record = shop.sagas.signal("w-1", "refunded", None)

    # then
    assert record.steps[1].state == StepState.WAITING
    assert shop.driver.take() == []


def test_a_timeout_taken_as_a_path_goes_on_the_other_way(shop: Shop) -> None:
    # given
    _waiter(shop, timeout=30, catch=True).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(30_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()
    with pytest.raises(SagaAlreadyFinal):  # too late: the saga completed without it
        shop.sagas.signal("w-1", "paid", {"amount": 5})

    # then
    record = shop.record("w-1")
    assert record.state == SagaState.COMPLETED
    assert record.steps[1].result == {"timeout": True}
    assert shop.script.names() == ["reserve", "ship"]
    assert record.signals == ()


def test_an_uncaught_timeout_rolls_the_saga_back(shop: Shop) -> None:
    # given
    _waiter(shop, timeout=30).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(30_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    record = shop.record("w-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "signal_timeout")
    assert shop.script.names() == ["reserve", "release"]


def test_a_signal_before_the_timeout_wins_over_it(shop: Shop) -> None:
    # given
    _waiter(shop, timeout=30).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(29_999)
    shop.sagas.signal("w-1", "paid", {"amount": 3})
    shop.driver.run_until_idle()

    # then
    assert shop.record("w-1").state == SagaState.COMPLETED


def test_cancel_during_a_signal_wait_compensates_at_once(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    shop.sagas.cancel("w-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("w-1").state == SagaState.COMPENSATED


def test_a_signal_to_an_unknown_saga_raises_and_writes_nothing(shop: Shop) -> None:
    with pytest.raises(SagaNotFound):
        shop.sagas.signal("nobody", "paid", None)
    assert nothing_stored(shop.sagas.store)  # type: ignore[arg-type]


@pytest.mark.parametrize("call", [
    lambda s: s.signal("w-1", "bad name", None),
    lambda s: s.signal("w-1", "paid", {1: 2}),
    lambda s: s.signal("w-1", "paid", float("inf")),
    lambda s: s.signal("w-1", "paid", None, signal_id=""),
    lambda s: s.signal("bad id", "paid", None),
])
def test_bad_signals_are_refused_and_nothing_is_written(shop: Shop, call: Any) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    before = shop.sagas.store.get("saga", "w-1")

    # when / then
    with pytest.raises(SagaValidationError):
        call(shop.sagas)
    assert shop.sagas.store.get("saga", "w-1") == before


def test_a_signal_payload_over_a_quarter_of_the_payload_limit_is_refused(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    big = "x" * (shop.sagas.engine.settings.payload_limit // 4)

    # when / then
    with pytest.raises(PayloadTooLarge):
        shop.sagas.signal("w-1", "paid", big)


def test_a_waiting_saga_is_not_reported_stale(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    shop.driver.run_until_idle()

    # when
    shop.clock.advance(24 * 3_600_000)

    # then
    assert shop.sagas.all_findings() == []


def test_a_sleep_already_due_at_start_goes_on_at_once(shop: Shop) -> None:
    # given
    charge = shop.tasks["charge"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep(0)
        return ctx.step(charge, "card-1", 1)

    # when
    record = _define(shop, "no-nap", run).start({}, saga_id="z-1").record

    # then: no sweep needed
    assert record.steps[0].state == StepState.COMMITTED
    assert kinds(shop.driver.take()) == [("step", "shop.charge")]


def test_a_signal_from_a_process_without_the_definition_is_recorded(shop: Shop) -> None:
    # given
    _waiter(shop).start({}, saga_id="w-1")
    shop.driver.run_until_idle()
    registry = shop.sagas.registry
    waiter = registry.definitions.pop("waiter")

    # when
    record = shop.sagas.signal("w-1", "paid", {"amount": 1})

    # then: recorded, delivered later by a process that has the code
    assert [s.signal_id for s in record.signals] and record.steps[1].state == StepState.WAITING
    registry.definitions["waiter"] = waiter
    shop.sweep_when_stale()
    shop.driver.run_until_idle()
    assert shop.record("w-1").state == SagaState.COMPLETED
