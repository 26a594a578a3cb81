"""A saga runs to completion on real workers."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Stack


@pytest.mark.cluster
def test_saga_completes_with_every_step_committed(stack: Stack) -> None:
    stack.worker()
    handle = stack.shop.order.start({"sku": "A1", "amount": 5, "id": "o1"}, saga_id="happy-1")
    record = stack.wait_settled(handle.saga_id)
    assert record.state == "completed"
    assert [s.state for s in record.steps] == ["committed"] * 3
    assert record.steps[0].result == {"reservation": "res-A1"}
    assert [e["op"] for e in stack.ledger()] == [
        "reserve.start", "reserve.done", "charge.start", "charge.done", "ship.start", "ship.done",
    ]
    effect_ids = [e["effect_id"] for e in stack.ops("charge.done")]
    assert effect_ids == [record.steps[1].effect_id]
