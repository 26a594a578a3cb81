"""Durations are seconds or a ``timedelta`` wherever one is taken, and errors speak the unit
the user wrote (issue 25 item 13): ``sleep`` refused a ``timedelta``, ``sleep_until(-5)`` said
``got -5000``, ``sleep_until`` accepted year 9999 while ``sleep`` stops at 366 days, and
``ctx.step(ctx.call_child(...))`` did not point at ``ctx.child``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError
from tests.engine.conftest import Shop


def _define(shop: Shop, name: str, run: Any) -> Any:
    return shop.sagas.saga(name)(run)


def test_sleep_takes_a_timedelta(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: Any) -> Any:
        ctx.sleep(timedelta(minutes=2))
        return "woke"

    # when
    record = _define(shop, "td-sleep", run).start({}, saga_id="t-1").record

    # then
    timer = record.steps[0]
    assert timer.state == StepState.WAITING
    assert timer.wake_at_ms == shop.clock.now_ms() + 120_000
    shop.clock.advance(120_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()
    assert shop.record("t-1").state == SagaState.COMPLETED


def test_wait_signal_takes_a_timedelta_timeout(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: Any) -> Any:
        return ctx.wait_signal("go", timeout=timedelta(seconds=30))

    # when
    record = _define(shop, "td-wait", run).start({}, saga_id="w-1").record

    # then
    assert record.steps[0].wake_at_ms == shop.clock.now_ms() + 30_000


@pytest.mark.parametrize(("when", "says", "never"), [
    (-5, "got -5", "-5000"),
    (datetime(1969, 12, 31, tzinfo=timezone.utc), "from 1970 on", "-86400000"),
])
def test_sleep_until_before_the_epoch_is_refused_in_the_unit_given(
    shop: Shop, when: Any, says: str, never: str
) -> None:
    # given
    def run(ctx: Any, data: Any) -> Any:
        ctx.sleep_until(when)

    # when
    record = _define(shop, "early", run).start({}, saga_id="e-1").record

    # then
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert says in (record.reason or "") and never not in (record.reason or "")


def test_sleep_until_further_than_the_longest_sleep_is_refused_like_sleep(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: Any) -> Any:
        ctx.sleep_until(datetime(9999, 1, 1, tzinfo=timezone.utc))

    # when
    record = _define(shop, "far", run).start({}, saga_id="f-1").record

    # then
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert "366 days" in (record.reason or "")
    assert record.steps == ()


def test_a_sleep_past_366_days_names_the_maximum_in_seconds_and_days(shop: Shop) -> None:
    # given
    def run(ctx: Any, data: Any) -> Any:
        ctx.sleep(timedelta(days=400))

    # when
    record = _define(shop, "long", run).start({}, saga_id="l-1").record

    # then
    assert record.error_code == "invalid_step_call"
    assert "0..31622400 seconds (366 days)" in (record.reason or "")


def test_a_child_call_given_to_ctx_step_points_at_ctx_child(shop: Shop) -> None:
    # given
    _define(shop, "kid", lambda ctx, data: data)

    def run(ctx: Any, data: Any) -> Any:
        return ctx.step(ctx.call_child("kid", {}))

    # when
    record = _define(shop, "parent", run).start({}, saga_id="p-1").record

    # then
    assert record.error_code == "invalid_step_call"
    assert "ctx.child(definition, input)" in (record.reason or "")


def test_duration_settings_and_backoff_take_a_timedelta() -> None:
    # given / when
    sagas = Sagas(Celery("durations", broker="memory://localhost/", set_as_current=False),
                  store=MemoryStore(), allow_non_durable=True, retention=timedelta(days=30),
                  stale_after=timedelta(minutes=5), sweep_interval=timedelta(seconds=15))

    @sagas.step(compensate=None, idempotent=True, retries=2, name="td.step",
                backoff=lambda attempt: timedelta(seconds=attempt), time_limit=timedelta(minutes=1))
    def step() -> None:
        return None

    # then
    settings = sagas.settings
    assert settings.retention_ms == 30 * 86_400_000
    assert settings.timing.stale_ms == 300_000 and settings.sweep_interval_s == 15
    options = sagas.registry.step("td.step")
    assert options.backoff(2) == 2000 and options.time_limit_ms == 60_000
    with pytest.raises(SagaConfigurationError, match="seconds or a timedelta"):
        Sagas(Celery("bad", broker="memory://localhost/", set_as_current=False),
              store=MemoryStore(), allow_non_durable=True, retention=timedelta(seconds=-1))
