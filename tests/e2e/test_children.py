"""Child sagas on real workers (docs/design.md §3.7), on both stacks: a child that completes, a
child that compensates (the parent compensates), a parent compensating after its child
completed (the child undone in order), and 16 children in ``ctx.parallel``."""

from __future__ import annotations

import uuid

import pytest

from celery_sagas import SagaState
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _child_ids(stack: Stack, saga_id: str) -> list[str]:
    """The ids of a parent's children, as its child steps name them (``<id>/<n>``, with a
    ``.k`` suffix where needed to share the parent's bucket)."""
    record = stack.sagas.get(saga_id)
    ids = [s.kwargs["saga_id"] for s in record.steps if s.task == "celery_sagas.child"]
    for child_id in ids:
        assert child_id.startswith(saga_id + "/")
        assert stack.sagas.store.bucket_of(child_id) == stack.sagas.store.bucket_of(saga_id)
    return ids


def test_a_child_that_completes_hands_its_result_to_the_parent(stack: Stack) -> None:
    # given
    stack.worker()
    saga_id = _id("trip")

    # when
    stack.sagas.start("e2e-trip", {"sku": "A", "id": saga_id, "amount": 12}, saga_id=saga_id)

    # then
    parent = stack.wait_settled(saga_id)
    [child_id] = _child_ids(stack, saga_id)
    child = stack.sagas.get(child_id)
    assert (parent.state, child.state) == (SagaState.COMPLETED, SagaState.COMPLETED), parent
    assert parent.result == child.result == {"charged": 12}
    assert child.parent.saga_id == saga_id


def test_a_child_that_compensates_makes_the_parent_compensate(stack: Stack) -> None:
    # given
    stack.worker()
    saga_id = _id("trip")

    # when
    stack.sagas.start("e2e-trip", {"sku": "A", "id": saga_id, "amount": 12,
                                   "child_plan": {"decline": "charge"}}, saga_id=saga_id)

    # then
    parent = stack.wait_settled(saga_id)
    assert (parent.state, parent.error_code) == (SagaState.COMPENSATED, "child_compensated")
    [child_id] = _child_ids(stack, saga_id)
    assert stack.sagas.get(child_id).state == SagaState.COMPENSATED
    assert len(stack.ops("release", saga_id)) == 1
    assert stack.ops("ship.start", saga_id) == []


def test_a_parent_compensating_after_its_child_completed_undoes_it_in_order(stack: Stack) -> None:
    # given
    stack.worker()
    saga_id = _id("trip")

    # when: the step after the child is declined
    stack.sagas.start("e2e-trip", {"sku": "A", "id": saga_id, "amount": 12,
                                   "plan": {"decline": "ship"}}, saga_id=saga_id)

    # then: the child's charge is refunded before the parent's reservation is released
    parent = stack.wait_settled(saga_id)
    [child_id] = _child_ids(stack, saga_id)
    child = stack.sagas.get(child_id)
    assert (parent.state, child.state) == (SagaState.COMPENSATED, SagaState.COMPENSATED), parent
    [refund] = stack.ops("refund", child_id)
    [release] = stack.ops("release", saga_id)
    assert refund["t"] < release["t"]


def test_sixteen_children_in_parallel_all_complete(stack: Stack) -> None:
    # given
    stack.worker()
    saga_id = _id("fan")

    # when
    stack.sagas.start("e2e-fan", {"n": 16}, saga_id=saga_id)

    # then
    parent = stack.wait_settled(saga_id, timeout=120)
    assert parent.state == SagaState.COMPLETED, parent
    assert parent.result == list(range(16))
    children = [stack.sagas.get(child_id) for child_id in _child_ids(stack, saga_id)]
    assert len(children) == 16
    assert all(c.state == SagaState.COMPLETED for c in children)
    assert sum(len(stack.ops("charge.done", c.saga_id)) for c in children) == 16
