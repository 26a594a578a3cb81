"""Limits on real workers (docs/concepts.md "Limits"), driven as an operator would, from the
shell: a saga that starts itself as its child stops at ``sagas_child_depth_limit`` and the whole
chain compensates; a chain at the limit is cancelled from the shell; signals nobody waits for
are refused past ``sagas_signal_limit`` (exit 1) and the saga is still cancelled; a signal to a
final saga exits 1 unless it repeats one the saga holds."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_sagas import SagaState
from celery_sagas._records import StepState
from tests.e2e.app import build
from tests.e2e.conftest import Stack, wait_until
from tests.e2e.test_cli_subprocess import celery_sagas

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

DEPTH = 8  # sagas_child_depth_limit's default


def _sagas(stack: Stack) -> dict[str, Any]:
    """Every saga of this test's store, by id."""
    return {r.saga_id: r for r in stack.sagas.browse(limit=1000).records}


def _waiting_for_go(stack: Stack, prefix: str) -> str:
    """A new e2e-signal saga's id, once it waits for its "go" signal (a worker running)."""
    stack.worker()
    saga_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    stack.sagas.start("e2e-signal", {"sku": "A", "id": saga_id}, saga_id=saga_id)
    wait_until(lambda: len(stack.sagas.get(saga_id).steps) == 2, what="the wait")
    return saga_id


def test_a_saga_that_starts_itself_stops_at_the_depth_limit_and_the_chain_compensates(
        redis_stack: Stack) -> None:
    # given
    redis_stack.worker()
    root = f"rec-{uuid.uuid4().hex[:6]}"

    # when: it would nest fifty levels deep
    redis_stack.sagas.start("e2e-recurse", {"sku": "A", "left": 50}, saga_id=root)

    # then: the root and eight levels of children, every one compensated
    settled = redis_stack.wait_settled(root, timeout=120)
    assert (settled.state, settled.error_code) == (SagaState.COMPENSATED, "child_compensated")
    found = _sagas(redis_stack)
    assert len(found) == DEPTH + 1, sorted(found)
    assert {r.state for r in found.values()} == {SagaState.COMPENSATED}
    deepest = max(found.values(), key=lambda r: r.saga_id.count("/"))
    child_step = deepest.steps[1]
    assert (child_step.state, child_step.error_code) == (StepState.FAILED, "child_depth_exceeded")
    assert len(redis_stack.ops("release")) == DEPTH + 1
    redis_stack.sagas.sweep()
    assert len(_sagas(redis_stack)) == DEPTH + 1  # nothing grows afterwards


def test_a_chain_at_the_depth_limit_is_cancelled_from_the_shell(redis_stack: Stack) -> None:
    # given: a chain exactly at the limit, its deepest saga waiting
    redis_stack.worker()
    root = f"deep-{uuid.uuid4().hex[:6]}"
    redis_stack.sagas.start("e2e-recurse", {"sku": "A", "left": DEPTH}, saga_id=root)

    def deepest_waits() -> bool:
        found = _sagas(redis_stack)
        waiting = [r for r in found.values() if r.steps and r.steps[-1].task ==
                   "celery_sagas.wait_signal" and r.steps[-1].state is StepState.WAITING]
        return len(found) == DEPTH + 1 and len(waiting) == 1

    wait_until(deepest_waits, timeout=120, what="the chain at the depth limit")

    # when
    done = celery_sagas(redis_stack, "cancel", root)

    # then
    assert done.returncode == 0, done.stderr
    redis_stack.wait_settled(root, timeout=120)
    wait_until(lambda: {r.state for r in _sagas(redis_stack).values()} == {SagaState.COMPENSATED},
               timeout=120, what="every level compensated")
    assert len(redis_stack.ops("release")) == DEPTH + 1


def test_signals_nobody_waits_for_are_refused_past_the_limit_and_the_saga_still_cancels(
        redis_stack: Stack) -> None:
    # given: a saga waiting for "go", sent a hundred signals of another name
    saga_id = _waiting_for_go(redis_stack, "sig")
    for i in range(100):
        redis_stack.sagas.signal(saga_id, "other", {"n": i, "pad": "x" * 1000})
    before = redis_stack.sagas.get(saga_id)

    # when
    refused = celery_sagas(redis_stack, "signal", saga_id, "other", "--payload", '{"n": 100}')
    cancelled = celery_sagas(redis_stack, "cancel", saga_id)

    # then
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "sagas_signal_limit" in refused.stderr
    assert cancelled.returncode == 0, cancelled.stderr
    record = redis_stack.wait_settled(saga_id)
    assert record.state is SagaState.COMPENSATED
    assert (len(before.signals), record.signals, record.signals_dropped) == (100, (), 100)
    assert len(redis_stack.ops("release", saga_id)) == 1


def test_a_saga_past_the_record_limit_in_signals_refuses_more_and_still_cancels(
        redis_stack: Stack) -> None:
    # given: a saga waiting for "go", grown past the 1 MiB record limit by 280 signals of 4 KB
    # that a process with higher limits let in (issue 25 defect 2: the next signal raised
    # PayloadTooLarge yet was recorded, and `celery sagas cancel` exited 2)
    saga_id = _waiting_for_go(redis_stack, "big")
    loose = build(redis_stack.config, payload_limit=8 * 2**20, signal_limit=1000,
                  signal_bytes_limit=8 * 2**20)
    try:
        for i in range(280):
            loose.sagas.signal(saga_id, "other", {"n": i, "pad": "x" * 4000})
    finally:
        loose.sagas.store.close()
    before = redis_stack.sagas.get(saga_id)
    assert sum(len(str(s.payload)) for s in before.signals) > 2**20

    # when: an operator with the default limits signals it, then cancels it
    refused = celery_sagas(redis_stack, "signal", saga_id, "other", "--payload", '{"n": 280}')
    after_refusal = redis_stack.sagas.get(saga_id)
    cancelled = celery_sagas(redis_stack, "cancel", saga_id)

    # then: the signal is refused and written nowhere; the cancel compensates on the worker
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "sagas_signal_limit" in refused.stderr, refused.stderr
    assert (after_refusal.version, after_refusal.signals) == (before.version, before.signals)
    assert cancelled.returncode == 0, (cancelled.stdout, cancelled.stderr)
    record = redis_stack.wait_settled(saga_id)
    assert record.state is SagaState.COMPENSATED
    assert (record.signals, record.signals_dropped) == ((), 280)
    assert len(redis_stack.ops("release", saga_id)) == 1


def test_a_signal_to_a_final_saga_exits_1_unless_it_repeats_one_the_saga_holds(
        redis_stack: Stack) -> None:
    # given: a saga completed by the signal hook-1
    redis_stack.worker()
    saga_id = f"fin-{uuid.uuid4().hex[:6]}"
    redis_stack.sagas.start("e2e-signal", {"sku": "A", "id": saga_id}, saga_id=saga_id)
    redis_stack.sagas.signal(saga_id, "go", {"amount": 4}, signal_id="hook-1")
    assert redis_stack.wait_settled(saga_id).state is SagaState.COMPLETED
    before = redis_stack.sagas.get(saga_id)

    # when
    repeat = celery_sagas(redis_stack, "signal", saga_id, "go", "--payload", '{"amount": 4}',
                          "--signal-id", "hook-1")
    late = celery_sagas(redis_stack, "signal", saga_id, "go", "--payload", '{"amount": 5}')

    # then
    assert repeat.returncode == 0, repeat.stderr
    assert late.returncode == 1, (late.stdout, late.stderr)
    assert "completed" in late.stderr and "signal refused" in late.stderr
    after = redis_stack.sagas.get(saga_id)
    assert (after.version, after.signals) == (before.version, before.signals)
