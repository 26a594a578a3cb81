"""Operator actions and start() contracts on real workers."""

from __future__ import annotations

import math

import pytest

from celery_sagas.errors import SagaConflictError, SagaValidationError
from tests.e2e.conftest import Stack, wait_until


@pytest.mark.cluster
def test_resolve_then_resume_completes_an_ambiguous_saga(stack: Stack) -> None:
    stack.worker()
    plan = {"crash": "charge"}
    stack.shop.order.start({"sku": "R", "amount": 9, "id": "r1", "plan": plan}, saga_id="res-1")
    record = stack.wait_settled("res-1")
    assert record.state == "manual-review"
    charge = record.steps[1]
    with pytest.raises(Exception, match="effect id"):
        stack.sagas.resolve("res-1", charge.name, "not-the-effect", "committed", result={})
    stack.sagas.resolve("res-1", charge.name, charge.effect_id, "committed",
                        result={"charged": 9})
    stack.sagas.resume("res-1")
    record = stack.wait_settled("res-1")
    assert record.state == "completed"
    assert record.steps[1].result == {"charged": 9}
    assert len(stack.ops("charge.start", "res-1")) == 1
    assert len(stack.ops("ship.done", "res-1")) == 1


def test_cancel_waits_for_the_running_step_then_compensates(stack: Stack) -> None:
    stack.worker()
    plan = {"block": "charge", "release": "go"}
    stack.shop.order.start({"sku": "X", "amount": 4, "id": "x1", "plan": plan}, saga_id="can-1")
    wait_until(lambda: stack.ops("charge.start", "can-1"), what="charge started")
    assert stack.sagas.cancel("can-1").state == "compensating"
    stack.release("go")
    record = stack.wait_settled("can-1")
    assert record.state == "compensated"
    assert record.error_code == "cancelled"
    assert [e["op"] for e in stack.ledger() if e["op"] in ("refund", "release")] == [
        "refund", "release",
    ]
    assert stack.ops("ship.start", "can-1") == []
    assert stack.sagas.cancel("can-1").state == "compensated"


def test_start_is_idempotent_and_refuses_a_reused_id(redis_stack: Stack) -> None:
    redis_stack.worker()
    order = {"sku": "S", "amount": 1, "id": "s1"}
    first = redis_stack.shop.order.start(order, saga_id="idem-1")
    second = redis_stack.shop.order.start(dict(order), saga_id="idem-1")
    assert second.record.created_at_ms == first.record.created_at_ms
    assert redis_stack.wait_settled("idem-1").state == "completed"
    redis_stack.shop.order.start(order, saga_id="idem-1")
    with pytest.raises(SagaConflictError):
        redis_stack.shop.order.start({**order, "amount": 2}, saga_id="idem-1")
    assert len(redis_stack.ops("reserve.start", "idem-1")) == 1


@pytest.mark.parametrize(
    ("saga_id", "data"),
    [
        ("bad-1", {"amount": math.nan}),
        ("bad-2", {"when": object()}),
        ("bad-3", {"blob": "x" * (2 * 1024 * 1024)}),
        ("bad id", {"sku": "A"}),
        ("x" * 200, {"sku": "A"}),
    ],
)
def test_bad_input_raises_and_stores_nothing(redis_stack: Stack, saga_id: str, data: object) -> None:
    with pytest.raises(SagaValidationError):
        redis_stack.shop.order.start(data, saga_id=saga_id)
    if " " not in saga_id and len(saga_id) <= 128:
        assert redis_stack.sagas.get(saga_id) is None
    assert list(redis_stack.sagas.store._client.scan_iter(
        match=redis_stack.sagas.store.layout.pattern())) == []
