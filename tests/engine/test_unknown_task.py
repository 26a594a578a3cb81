"""A step naming a compensator nobody registered is refused when a worker starts; a task a
worker does not have stops its saga as ``unknown_task`` (issue 16 item 1), which ``resume``
(once the task is deployed) or ``resolve`` gets out of. Real workers: tests/e2e/test_misuse.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from celery_sagas._celery import hooks
from celery_sagas._celery.hooks import unregistered_compensators
from celery_sagas._celery.messages import saga_ref
from celery_sagas._protocol import codes
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaResolutionError
from tests.engine.conftest import Shop


class _Message:
    """A task message as the worker's consumer hands it to ``task_unknown`` (protocol 2)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.payload = ((), kwargs, {})


def _received_unknown(shop: Shop, task: str, effect_id: str, saga_id: str, step: str) -> None:
    consumer = SimpleNamespace(app=shop.sagas.app)
    message = _Message({"_saga": saga_ref(saga_id, step, 1)})
    hooks._unknown_task(consumer, message=message, name=task, id=effect_id)


def _worker_of(shop: Shop) -> Any:
    return SimpleNamespace(app=shop.sagas.app)


def test_a_worker_refuses_to_start_naming_the_step_and_the_missing_compensator(shop: Shop) -> None:
    @shop.sagas.step(name="t.pay", compensate="typo.name")
    def pay(x: int) -> int:
        return x

    with pytest.raises(SystemExit, match=r"step 't.pay' names compensator 'typo.name'"):
        hooks._worker_starting(_worker_of(shop))


def test_a_worker_with_every_compensator_registered_starts(
        shop: Shop, caplog: pytest.LogCaptureFixture) -> None:
    # given: sagas whose steps all name registered compensators
    assert shop.sagas.registry.steps and unregistered_compensators(shop.sagas.registry) == []

    # when
    with caplog.at_level(logging.DEBUG, logger="celery_sagas"):
        started = hooks._worker_starting(_worker_of(shop))

    # then: no SystemExit, and nothing logged as a problem
    assert started is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_worker_of_an_app_without_sagas_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    from celery import Celery

    # given: pickle settings a saga worker refuses, on an app that has no sagas
    plain = Celery("plain", set_as_current=False)
    plain.conf.update(task_serializer="pickle", accept_content=["pickle", "json"])
    assert hooks.guarded(plain) is None

    # when
    with caplog.at_level(logging.DEBUG, logger="celery_sagas"):
        started = hooks._worker_starting(SimpleNamespace(app=plain))

    # then: not refused, nothing logged
    assert started is None
    assert caplog.records == []


def test_an_unknown_compensator_stops_the_saga_as_unknown_task_and_resolve_settles_it(
    shop: Shop,
) -> None:
    # given: ship is declined, so charge's compensator (refund) is sent
    message = shop.refund_pending()
    step = shop.step("shop.charge")

    # when: the worker that received it has no such task
    _received_unknown(shop, "shop.refund", message.effect_id, "o-1", "shop.charge")

    # then: manual review naming the compensator; nothing is sent again by the sweep
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, codes.UNKNOWN_TASK)
    assert "shop.refund" in (record.reason or "") and "shop.charge" in (record.reason or "")
    assert shop.step("shop.charge").error_code == codes.UNKNOWN_TASK
    shop.sweep_when_stale()
    assert shop.driver.take() == []

    # when: the operator refunded by hand
    shop.sagas.resolve("o-1", "shop.charge", step.compensation_effect_id, "compensated")
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then: the rest is compensated as usual; refund never ran here
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.step("shop.charge").state == StepState.COMPENSATED
    assert "refund" not in shop.script.names()


def test_resume_after_deploying_the_task_sends_it_again_under_the_same_effect_id(shop: Shop) -> None:
    # given
    message = shop.refund_pending()
    _received_unknown(shop, "shop.refund", message.effect_id, "o-1", "shop.charge")

    # when
    shop.sagas.resume("o-1")
    shop.sweep_when_stale()
    sent = shop.driver.take()

    # then
    assert [(m.kind, m.effect_id) for m in sent] == [("compensation", message.effect_id)]


def test_an_unknown_step_task_stops_the_saga_and_resolve_not_committed_compensates(shop: Shop) -> None:
    # given
    shop.start_order()
    [message] = shop.driver.take()

    # when
    _received_unknown(shop, "shop.reserve", message.effect_id, "o-1", "shop.reserve")

    # then
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, codes.UNKNOWN_TASK)
    step = shop.step("shop.reserve")
    assert (step.state, step.error_code, step.attempts) == (StepState.EXECUTING, codes.UNKNOWN_TASK, 0)

    # when: the operator confirms nothing was reserved
    shop.sagas.resolve("o-1", "shop.reserve", step.effect_id, "not-committed")
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == []


def test_a_claimed_effect_is_not_taken_for_an_unknown_task(shop: Shop) -> None:
    # given: the step's body began on a worker that has the task
    shop.start_order()
    [message] = shop.driver.take()
    shop.claim_as("other-host:1/x", "shop.reserve")

    # when: a stray copy reached a worker without it
    _received_unknown(shop, "shop.reserve", message.effect_id, "o-1", "shop.reserve")

    # then: nothing changes
    assert shop.record().state == SagaState.RUNNING


def test_resolve_refuses_an_executing_step_that_is_not_unknown_task(shop: Shop) -> None:
    shop.start_order()
    step = shop.step("shop.reserve")
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", "shop.reserve", step.effect_id, "committed", result={})


def test_a_message_of_another_app_or_without_a_saga_reference_is_ignored(shop: Shop) -> None:
    shop.start_order()
    consumer = SimpleNamespace(app=shop.sagas.app)
    hooks._unknown_task(consumer, message=_Message({}), name="x.y", id="e-1")
    assert shop.record().state == SagaState.RUNNING


def test_cancel_gets_a_saga_out_of_unknown_task_and_compensates_what_committed(shop: Shop) -> None:
    # given: reserve committed; charge's task is unknown to the worker that received it
    shop.start_order()
    shop.deliver_next()  # reserve
    [message] = shop.driver.take()
    _received_unknown(shop, "shop.charge", message.effect_id, "o-1", "shop.charge")
    assert shop.record().error_code == codes.UNKNOWN_TASK

    # when
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then: charge never began, so it is abandoned; reserve is released
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.step("shop.charge").state == StepState.FAILED
    assert shop.script.names() == ["reserve", "release"]
