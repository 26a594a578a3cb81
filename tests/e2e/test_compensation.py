"""Known failures are compensated in reverse order on real workers."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Stack


@pytest.mark.cluster
def test_known_failure_compensates_committed_steps_in_reverse_order(stack: Stack) -> None:
    stack.worker()
    order = {"sku": "B2", "amount": 7, "id": "o2", "plan": {"decline": "ship"}}
    stack.shop.order.start(order, saga_id="comp-1")
    record = stack.wait_settled("comp-1")
    assert record.state == "compensated"
    assert record.error_code == "declined"
    assert [s.state for s in record.steps] == ["compensated", "compensated", "failed"]
    undo = [e["op"] for e in stack.ledger() if e["op"] in ("refund", "release")]
    assert undo == ["refund", "release"]
    release = stack.ops("release")[0]
    assert release["effect_id"] == record.steps[0].compensation_effect_id
    assert release["reservation"] == "res-B2"


def test_compensator_failing_twice_is_retried_by_beat_until_it_succeeds(redis_stack: Stack) -> None:
    redis_stack.worker()
    redis_stack.beat()
    plan = {"decline": "charge", "release_failures": 2}
    redis_stack.shop.order.start({"sku": "C3", "amount": 1, "id": "o3", "plan": plan},
                                 saga_id="comp-2")
    record = redis_stack.wait_settled("comp-2")
    assert record.state == "compensated"
    releases = redis_stack.ops("release")
    assert [r["attempt"] for r in releases] == [1, 2, 3]
    assert {r["effect_id"] for r in releases} == {record.steps[0].compensation_effect_id}
    assert record.steps[0].compensation_attempts == 3
    assert redis_stack.ops("refund") == []
