"""Approval gates on real prefork workers: Redis/Redis and RabbitMQ/PostgreSQL.

The saga is ``e2e-gated`` of ``tests.e2e.approval_app``: reserve, a manager approval, charge.
The test process plays the web handler: it reads the pending approval and its token, decides
as the manager, and resumes as the requester; the workers do the rest.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from celery_sagas.errors import ApprovalTokenReplay
from tests.e2e.approval_app import build, write_settings
from tests.e2e.conftest import Stack, wait_until

pytestmark = pytest.mark.e2e

REQUESTER = {"tenant_id": "t1", "principal_id": "alice"}


def gated(stack: Stack, ttl: float = 900.0) -> Stack:
    """Make ``stack`` (client and the processes it will start) run the approval app."""
    write_settings(stack.config.control, secrets.token_hex(32), ttl)
    stack.shop = build(stack.config)
    stack.app_module = "tests.e2e.approval_app"
    return stack


def start(stack: Stack, saga_id: str, amount: int = 250) -> None:
    order = {"id": saga_id, "amount": amount, "tenant": "t1", "requester": "alice"}
    stack.shop.order.start(order, saga_id=saga_id)


def pending(stack: Stack, saga_id: str) -> Any:
    """The saga's pending approval, once a worker has parked it at the gate."""
    found = wait_until(lambda: stack.sagas.approvals.pending(saga_id), timeout=60,
                       what=f"{saga_id} waiting for approval")
    [approval] = found
    return approval


def decide(stack: Stack, approval: Any, decision: str) -> None:
    stack.sagas.approvals.decide(approval.approval_id, tenant_id="t1", decision=decision,
                                 decided_by="bob")


def test_approve_then_resume_completes_without_holding_a_worker(stack: Stack) -> None:
    # given: one worker process, and two sagas that both reach their gate on it
    gated(stack).worker(concurrency=1)
    start(stack, "g-1")
    start(stack, "g-2")
    approvals = [pending(stack, "g-1"), pending(stack, "g-2")]
    assert stack.ops("charge") == []

    # when: the manager approves and each requester resumes with its token
    for saga_id, approval in zip(("g-1", "g-2"), approvals, strict=True):
        decide(stack, approval, "approved")
        stack.sagas.approvals.resume(saga_id, approval.token, **REQUESTER)

    # then
    for saga_id, approval in zip(("g-1", "g-2"), approvals, strict=True):
        record = stack.wait_settled(saga_id)
        assert record.state == "completed"
        assert record.step("manager").result == {"approval_id": approval.approval_id,
                                                 "decided_by": "bob"}
        assert [e["op"] for e in stack.ledger() if e["saga_id"] == saga_id] == ["reserve", "charge"]
        with pytest.raises(ApprovalTokenReplay):
            stack.sagas.approvals.resume(saga_id, approval.token, **REQUESTER)
    logs = "\n".join(process.text() for process in stack.processes)
    assert all(approval.token not in logs for approval in approvals)


def test_deny_compensates_what_came_before(stack: Stack) -> None:
    # given
    gated(stack).worker()
    start(stack, "d-1")
    approval = pending(stack, "d-1")

    # when
    decide(stack, approval, "denied")

    # then
    record = stack.wait_settled("d-1")
    assert (record.state, record.error_code) == ("compensated", "approval_denied")
    assert [e["op"] for e in stack.ledger()] == ["reserve", "release"]
    assert stack.sagas.approvals.pending("d-1") == []


@pytest.mark.parametrize("which", ["redis_stack", "cluster_stack"])
def test_expiry_found_by_the_beat_driven_sweep_compensates(
    which: str, request: pytest.FixtureRequest
) -> None:
    # given: approvals expire after two seconds and beat sweeps every second
    redis_stack: Stack = request.getfixturevalue(which)
    gated(redis_stack, ttl=2.0).worker()
    redis_stack.beat()
    start(redis_stack, "x-1")
    approval = pending(redis_stack, "x-1")

    # when nobody decides, then
    record = redis_stack.wait_settled("x-1")
    assert (record.state, record.error_code) == ("compensated", "approval_expired")
    assert [e["op"] for e in redis_stack.ledger()] == ["reserve", "release"]
    # the same sweep's approval pass marks the record (the saga may settle before it does)
    approvals = redis_stack.sagas.approvals
    wait_until(lambda: approvals.get(approval.approval_id).state == "expired", timeout=30,
               what="approval marked expired")
