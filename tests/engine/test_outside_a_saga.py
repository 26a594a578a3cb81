"""A step or compensator used outside a saga never runs its body (issue 16 item 9): without a
claim and an effect id nothing would guard it. Called directly it raises ``SagaUsageError``;
the worker's side (a ``.delay()`` message rejected) is in tests/e2e/test_misuse.py."""

from __future__ import annotations

import pytest
from celery.exceptions import Reject

from celery_sagas import SagaUsageError
from tests.engine.conftest import Shop


@pytest.mark.parametrize(("task", "args"), [("charge", ("card-1", 30)), ("refund", ("card-1", 30))],
                         ids=["step", "compensator"])
def test_a_direct_call_raises_before_the_body_runs(shop: Shop, task: str, args: tuple[object, ...]) -> None:
    # when / then
    with pytest.raises(SagaUsageError, match="only inside a saga"):
        shop.tasks[task](*args)
    assert shop.script.calls == []


def test_an_eager_apply_fails_before_the_body_runs(shop: Shop) -> None:
    # when
    result = shop.tasks["charge"].apply(args=("card-1", 30))

    # then
    assert isinstance(result.result, SagaUsageError)
    assert shop.script.calls == []


def test_a_worker_delivery_without_saga_context_is_rejected_not_requeued(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a request as a worker builds it for a message sent with .delay()
    task = shop.tasks["charge"]
    task.push_request(id="m-1", called_directly=False, is_eager=False)
    try:
        # when / then
        with pytest.raises(Reject) as raised:
            task("card-1", 30)
    finally:
        task.pop_request()
    assert raised.value.requeue is False
    assert isinstance(raised.value.reason, SagaUsageError)
    assert shop.script.calls == []
    assert any(r.levelname == "ERROR" and "without saga context" in r.getMessage()
               for r in caplog.records)


def test_the_body_stays_testable_through_run(shop: Shop) -> None:
    assert shop.tasks["charge"].run("card-1", 30) == {"charge": "ch-card-1"}
    assert shop.script.names() == ["charge"]
