"""Durable timers, signals and versioning on real workers and beat (docs/design.md §3.4-3.6),
on both stacks (Redis/Redis and RabbitMQ/PostgreSQL).

- a 3 s sleep resumes after >= 3 s, woken by the sweep (polled with a deadline; typically
  within the sweep interval plus a second, the figure printed), also when the worker and beat
  are SIGKILLed during the sleep;
- a signal sent before the wait and one sent after it are both received; the one sent after
  wakes the saga at once (no beat runs);
- a wait's timeout is taken as another path;
- a signal id sent twice counts once;
- a patched saga: one saga in flight from the old code and one started on the new code both
  finish, each on its own path, after the deploy.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas import SagaState, StepState
from tests.e2e.app import build
from tests.e2e.conftest import Stack, wait_until

pytestmark = pytest.mark.e2e

SLEEP_S = 3.0
RESUME_DEADLINE_S = 30.0  # a sweep runs every second: a resumed sleep shows up long before


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _waiting(stack: Stack, saga_id: str, position: int, timeout: float = 60) -> Any:
    def parked() -> Any:
        record = stack.sagas.get(saga_id)
        if record is None or len(record.steps) <= position:
            return None
        return record if record.steps[position].state is StepState.WAITING else None

    return wait_until(parked, timeout=timeout, what=f"{saga_id} waiting at step {position + 1}")


def _resumed_at(stack: Stack, saga_id: str) -> float:
    [started] = stack.ops("charge.start", saga_id)
    return float(started["t"])


def _assert_resumed_in_time(stack: Stack, saga_id: str, ready_at: float = 0.0) -> None:
    # Never early; resumed by a sweep once due, polled with a generous deadline (a loaded
    # machine delays beat and the worker; the figure itself is printed, not bounded).
    def timer_set() -> Any:
        record = stack.sagas.get(saga_id)
        return record is not None and len(record.steps) > 1 and record.steps[1].wake_at_ms

    wake = wait_until(timer_set, what=f"{saga_id} sleeping") / 1000
    due = max(wake, ready_at)
    wait_until(lambda: stack.ops("charge.start", saga_id),
               timeout=max(0.0, due - time.time()) + RESUME_DEADLINE_S,
               what=f"{saga_id} resumed by a sweep after its wake-up")
    record = stack.wait_settled(saga_id)
    assert record.state == SagaState.COMPLETED, record
    assert record.steps[1].committed_at_ms is not None
    slept_from = wake - SLEEP_S
    resumed = _resumed_at(stack, saga_id)
    assert resumed - slept_from >= SLEEP_S
    print(f"{saga_id}: slept {resumed - slept_from:.2f}s, resumed {resumed - due:.2f}s "
          "after the wake-up")  # the figure the issue asks for (shown with -s -n 0)


def test_a_sleep_resumes_after_its_time_within_the_sweep_interval(stack: Stack) -> None:
    # given
    stack.worker()
    stack.beat()
    saga_id = _id("sleep")

    # when
    stack.sagas.start("e2e-sleep", {"sku": "A", "amount": 5, "seconds": SLEEP_S}, saga_id=saga_id)

    # then
    _waiting(stack, saga_id, 1)
    _assert_resumed_in_time(stack, saga_id)


def test_a_sleep_survives_a_sigkill_of_the_worker_and_beat(stack: Stack) -> None:
    # given: the saga sleeps
    worker, beat = stack.worker(), stack.beat()
    saga_id = _id("sleep")
    stack.sagas.start("e2e-sleep", {"sku": "A", "amount": 5, "seconds": SLEEP_S}, saga_id=saga_id)
    _waiting(stack, saga_id, 1)

    # when: both die during the sleep and come back
    worker.kill()
    beat.kill()
    stack.worker()
    stack.beat()
    ready_at = time.time()

    # then
    _assert_resumed_in_time(stack, saga_id, ready_at)
    assert len(stack.ops("charge.start", saga_id)) == 1


def test_signals_sent_before_and_after_the_wait_are_both_received(stack: Stack) -> None:
    # given: no beat: only the signal itself can wake a waiting saga
    stack.worker()
    before, after = _id("before"), _id("after")
    block = {"block": "reserve", "release": "go-reserve"}
    stack.sagas.start("e2e-signal", {"sku": "A", "id": before, "plan": block}, saga_id=before)
    stack.sagas.start("e2e-signal", {"sku": "B", "id": after}, saga_id=after)

    # when: one signal while reserve still runs, one once the saga waits
    wait_until(lambda: stack.ops("reserve.start", before), what="reserve running")
    stack.sagas.signal(before, "go", {"amount": 7})
    stack.release("go-reserve")
    _waiting(stack, after, 1)
    stack.sagas.signal(after, "go", {"amount": 9})

    # then
    for saga_id, amount in ((before, 7), (after, 9)):
        record = stack.wait_settled(saga_id, timeout=30)
        assert record.state == SagaState.COMPLETED, record
        assert record.steps[1].result["payload"] == {"amount": amount}
        assert [s.consumed_by for s in record.signals] == ["signal:go"]


def test_a_timeout_is_taken_as_another_path(stack: Stack) -> None:
    # given
    stack.worker()
    stack.beat()
    saga_id = _id("timeout")

    # when
    stack.sagas.start("e2e-signal", {"sku": "A", "id": saga_id, "timeout": 2}, saga_id=saga_id)

    # then: the run caught SignalTimeout and shipped instead of charging
    record = stack.wait_settled(saga_id)
    assert record.state == SagaState.COMPLETED, record
    assert record.steps[1].result == {"timeout": True}
    assert record.steps[-1].name == stack.shop.tasks["ship"].name
    assert stack.ops("charge.start", saga_id) == []


def test_a_signal_id_sent_twice_counts_once(stack: Stack) -> None:
    # given: a saga that waits for two "go" signals
    stack.worker()
    saga_id = _id("twice")
    stack.sagas.start("e2e-signal", {"sku": "A", "id": saga_id, "waits": 2}, saga_id=saga_id)
    _waiting(stack, saga_id, 1)

    # when: a webhook delivers the same signal twice
    stack.sagas.signal(saga_id, "go", {"amount": 1}, signal_id="hook-1")
    stack.sagas.signal(saga_id, "go", {"amount": 1}, signal_id="hook-1")

    # then: only the first wait was served; a new id serves the second
    record = _waiting(stack, saga_id, 2)
    assert [s.signal_id for s in record.signals] == ["hook-1"]
    stack.sagas.signal(saga_id, "go", {"amount": 2}, signal_id="hook-2")
    record = stack.wait_settled(saga_id, timeout=30)
    assert record.state == SagaState.COMPLETED, record
    [charged] = stack.ops("charge.done", saga_id)
    assert charged is not None
    assert record.steps[-1].result == {"charged": 3}


def test_a_patched_saga_keeps_old_sagas_on_their_path_across_a_deploy(stack: Stack) -> None:
    # given: an old saga waits on version 1 of the code
    old_worker = stack.worker()
    old = _id("old")
    stack.sagas.start("e2e-patched", {"sku": "A", "id": old, "amount": 4}, saga_id=old)
    _waiting(stack, old, 1)

    # when: version 2 is deployed (worker and this process), a new saga starts on it
    old_worker.stop()
    stack.config = replace(stack.config, code_version=2)
    stack.shop = build(stack.config)
    stack.worker()
    new = _id("new")
    stack.sagas.start("e2e-patched", {"sku": "B", "id": new, "amount": 6}, saga_id=new)
    _waiting(stack, new, 2)
    stack.sagas.signal(old, "go")
    stack.sagas.signal(new, "go")

    # then: both finish, none goes to review, each on its own path
    old_record, new_record = stack.wait_settled(old), stack.wait_settled(new)
    assert (old_record.state, new_record.state) == (SagaState.COMPLETED, SagaState.COMPLETED)
    reserve, charge, ship = (stack.shop.tasks[n].name for n in ("reserve", "charge", "ship"))
    assert [s.name for s in old_record.steps] == [reserve, "signal:go", ship]
    assert [s.name for s in new_record.steps] == [reserve, charge, "signal:go", ship]
    assert (old_record.patches, new_record.patches) == ((), ("charge-before-go",))
    assert stack.ops("charge.start", old) == []
