"""What ``start()`` promises with real workers: one ``create`` carries the first step's intent,
a crash before its send is repaired by the sweep, and a ``run`` that fails before its first step
is settled by ``start()`` itself."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas.testing.dispatcher import RecordingDispatcher
from tests.e2e.conftest import Stack


@pytest.mark.cluster
def test_a_start_that_died_between_its_create_and_its_send_is_repaired_by_the_sweep(
    stack: Stack,
) -> None:
    # given: a client whose process "dies" right after the create (its send never happens)
    sagas = stack.sagas
    sent = sagas.dispatcher
    sagas._send_through(RecordingDispatcher())
    try:
        created = stack.shop.order.start({"sku": "S", "amount": 3, "id": "s1"},
                                         saga_id="lost-send").record
    finally:
        sagas._send_through(sent)
    assert [s.state for s in created.steps] == ["executing"]  # the intent is in the record
    assert created.steps[0].started_at_ms is None

    # when: workers and beat run
    stack.worker()
    stack.beat()

    # then: the sweep sends the step under the effect id start() drew; every body runs once
    record = stack.wait_settled("lost-send")
    assert record.state == "completed"
    assert record.steps[0].effect_id == created.steps[0].effect_id
    assert [len(stack.ops(f"{op}.start", "lost-send")) for op in ("reserve", "charge", "ship")] == [
        1, 1, 1]


def test_a_run_that_raises_before_its_first_step_is_settled_by_start(stack: Stack) -> None:
    # given
    stack.worker()

    # when
    handle = stack.shop.order.start({"sku": "R", "amount": 1, "id": "r1",
                                     "plan": {"refuse_in_run": True}}, saga_id="refused-run")

    # then: start() wrote it to manual review at once, and no step was ever sent
    record: Any = handle.record
    assert stack.sagas.get("refused-run") == record
    assert (record.state, record.error_code, record.steps) == ("manual-review", "run_failed", ())
    assert record.version == 1  # one create, nothing after it
    stack.shop.order.start({"sku": "M", "amount": 1, "id": "m"}, saga_id="marker")  # a later saga
    assert stack.wait_settled("marker").state == "completed"
    assert stack.ops("reserve.start", "refused-run") == []
