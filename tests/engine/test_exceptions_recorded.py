"""What user code raised is kept where an operator looks (issue 16 item 10): the worker log
has the traceback at ERROR, and the record keeps the exception's type and message (shown by
``celery sagas show``); a later success clears it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import CardDeclined, Shop


def _error_with_traceback(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    formatter = logging.Formatter()
    return any(r.levelname == "ERROR" and r.exc_info and text in formatter.formatException(r.exc_info)
               for r in caplog.records)


def test_a_step_exception_is_logged_with_its_traceback_and_recorded(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    shop.script.then("charge", TimeoutError("provider did not answer"))

    shop.start_order()
    shop.driver.run_until_idle()

    step = shop.step("shop.charge")
    assert (step.state, step.exception) == (StepState.AMBIGUOUS, "TimeoutError: provider did not answer")
    assert _error_with_traceback(caplog, "provider did not answer")


def test_a_declared_failure_is_recorded_without_an_error_line(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    shop.script.then("charge", CardDeclined("insufficient funds"))

    shop.start_order()
    shop.driver.run_until_idle()

    assert shop.step("shop.charge").exception == "CardDeclined: insufficient funds"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_compensator_exception_is_logged_and_recorded_and_cleared_by_a_later_success(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    # given: refund raises once
    message = shop.refund_pending()
    shop.script.then("refund", ConnectionError("payments API down"))

    # when
    shop.driver.deliver(message)

    # then
    assert shop.step("shop.charge").exception == "ConnectionError: payments API down"
    assert _error_with_traceback(caplog, "payments API down")

    # when: the retry succeeds
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.step("shop.charge").exception is None


def test_a_run_exception_is_logged_with_its_traceback_and_recorded(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    @shop.sagas.saga("broken")
    def broken(ctx: Any, data: Any) -> Any:
        return data["missing"]

    record = broken.start({}, saga_id="b-1").record

    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "run_failed")
    assert record.exception == "KeyError: 'missing'"
    assert _error_with_traceback(caplog, 'data["missing"]')


def test_resume_clears_the_recorded_run_exception(shop: Shop) -> None:
    calls = {"n": 0}

    @shop.sagas.saga("flaky-run")
    def flaky(ctx: Any, data: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("config not loaded")
        return "ok"

    flaky.start({}, saga_id="f-1")
    resumed = shop.sagas.resume("f-1")

    assert resumed.state == SagaState.COMPLETED and resumed.exception is None
    assert resumed.traceback is None


def test_a_step_exception_keeps_where_it_was_raised_innermost_last(shop: Shop) -> None:
    shop.script.then("charge", TimeoutError("provider did not answer"))

    shop.start_order()
    shop.driver.run_until_idle()

    frames = shop.step("shop.charge").traceback
    assert frames is not None
    assert frames.splitlines()[-1].startswith("engine/conftest.py:")  # Script raises it
    assert all(" in " in line for line in frames.splitlines())


def test_a_run_exception_keeps_where_run_raised_it(shop: Shop) -> None:
    @shop.sagas.saga("broken-deep")
    def broken(ctx: Any, data: Any) -> Any:
        return data["missing"]

    record = broken.start({"card": "4111 1111"}, saga_id="b-2").record

    assert record.traceback is not None
    assert record.traceback.splitlines()[-1].startswith("engine/test_exceptions_recorded.py:")
    assert record.traceback.endswith(" in broken") and "4111" not in record.traceback
    assert shop.sagas.get("b-2").traceback == record.traceback  # stored, read back
