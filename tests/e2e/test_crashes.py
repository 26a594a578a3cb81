"""Killed workers never cause a silent re-run or a blind compensation."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.conftest import Stack, wait_until


def _blocked_pid(stack: Stack, op: str, saga_id: str) -> int:
    started = wait_until(lambda: stack.ops(f"{op}.start", saga_id), what=f"{op} started")
    return int(started[0]["pid"])


@pytest.mark.cluster
def test_pool_child_killed_mid_step_leaves_the_step_ambiguous(stack: Stack) -> None:
    stack.worker()
    plan = {"block": "charge", "release": "go"}
    stack.shop.order.start({"sku": "K", "amount": 3, "id": "k1", "plan": plan}, saga_id="kill-1")
    os.kill(_blocked_pid(stack, "charge", "kill-1"), signal.SIGKILL)
    record = stack.wait_settled("kill-1")
    stack.release("go")
    assert record.state == "manual-review"
    assert record.error_code == "ambiguous_step"
    charge = record.step("tests.e2e.app.charge")
    assert charge is not None and charge.state == "ambiguous"
    assert charge.effect_id in (record.reason or "")
    assert len(stack.ops("charge.start", "kill-1")) == 1
    assert stack.ops("release") == [] and stack.ops("refund") == []


def test_idempotent_step_killed_mid_body_is_rerun_under_the_same_effect_id(stack: Stack) -> None:
    stack.worker()
    plan = {"block": "charge", "release": "go", "idempotent": True}
    stack.shop.order.start({"sku": "I", "amount": 3, "id": "i1", "plan": plan}, saga_id="kill-2")
    os.kill(_blocked_pid(stack, "charge", "kill-2"), signal.SIGKILL)
    wait_until(lambda: len(stack.ops("charge.start", "kill-2")) == 2, what="second attempt")
    stack.release("go")
    record = stack.wait_settled("kill-2")
    assert record.state == "completed"
    starts = stack.ops("charge.start", "kill-2")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert {s["effect_id"] for s in starts} == {record.steps[1].effect_id}
    assert len(stack.ops("charge.done", "kill-2")) == 1


def test_whole_worker_killed_then_a_fresh_worker_and_beat_settle_the_saga(redis_stack: Stack) -> None:
    first = redis_stack.worker()
    plan = {"block": "charge", "release": "go"}
    redis_stack.shop.order.start({"sku": "W", "amount": 2, "id": "w1", "plan": plan},
                                 saga_id="kill-3")
    _blocked_pid(redis_stack, "charge", "kill-3")
    first.kill()
    redis_stack.release("go")
    redis_stack.worker()
    redis_stack.beat()
    record = redis_stack.wait_settled("kill-3")
    assert record.state == "manual-review"
    assert record.step("tests.e2e.app.charge").state == "ambiguous"  # type: ignore[union-attr]
    assert len(redis_stack.ops("charge.start", "kill-3")) == 1


def test_duplicated_step_messages_run_the_body_once(redis_stack: Stack) -> None:
    redis_stack.worker()
    plan = {"block": "reserve", "release": "go"}
    redis_stack.shop.order.start({"sku": "D", "amount": 2, "id": "d1", "plan": plan},
                                 saga_id="dup-1")
    _blocked_pid(redis_stack, "reserve", "dup-1")
    step = redis_stack.sagas.get("dup-1").steps[0]
    dispatcher = redis_stack.sagas.dispatcher
    dispatcher.send_step("dup-1", step, 1)  # while the first delivery runs
    redis_stack.release("go")
    record = redis_stack.wait_settled("dup-1")
    dispatcher.send_step("dup-1", step, 1)  # after it committed
    dispatcher.send_step("dup-1", record.steps[2], 1)
    assert record.state == "completed"
    # The duplicates are consumed without effect: send a marker saga through the same queue.
    redis_stack.shop.order.start({"sku": "M", "amount": 1, "id": "m"}, saga_id="dup-marker")
    redis_stack.wait_settled("dup-marker")
    assert len(redis_stack.ops("reserve.start", "dup-1")) == 1
    assert len(redis_stack.ops("ship.start", "dup-1")) == 1
