"""Inline steps on real prefork workers (docs/design.md §3.3): the next step runs in the
process that settled the previous one, claimed by the same write, with its own effect id."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests.e2e.conftest import Stack, wait_until
from tests.e2e.inline_app import build

pytestmark = pytest.mark.e2e


@pytest.fixture
def inline_stack(stack: Stack) -> Stack:
    """``stack`` whose client and workers load ``tests.e2e.inline_app``."""
    stack.shop = build(stack.config)
    stack.app_module = "tests.e2e.inline_app"
    return stack


def start(stack: Stack, saga_id: str, **data: Any) -> None:
    stack.shop.order.start(data, saga_id=saga_id)


def received(stack: Stack, effect_id: str) -> bool:
    """Whether a worker logged the message of ``effect_id`` as received from the broker."""
    return any(f"[{effect_id}] received" in p.text() for p in stack.processes)


def test_the_steps_after_the_first_run_in_the_settling_process(inline_stack: Stack) -> None:
    stack = inline_stack
    stack.worker()
    start(stack, "inl-1", plan={})
    record = stack.wait_settled("inl-1")
    assert record.state == "completed"
    a, b, c = record.steps
    assert len({a.effect_id, b.effect_id, c.effect_id}) == 3
    starts = {e["op"]: e for e in stack.ledger() if e["op"].endswith(".start")}
    assert starts["a.start"]["pid"] == starts["b.start"]["pid"] == starts["c.start"]["pid"]
    assert [starts[k]["effect_id"] for k in ("a.start", "b.start", "c.start")] == [
        a.effect_id, b.effect_id, c.effect_id]
    assert received(stack, a.effect_id)  # the first step is sent by start()
    assert not received(stack, b.effect_id) and not received(stack, c.effect_id)
    prerun = [e["task_id"] for e in stack.ops("prerun")]
    assert prerun == [a.effect_id, b.effect_id, c.effect_id]  # Celery's signals fire inline too
    assert all(s.attempts == 1 for s in record.steps)


def test_a_step_that_opted_out_goes_through_the_broker(inline_stack: Stack) -> None:
    stack = inline_stack
    stack.worker()
    start(stack, "inl-2", plan={}, sent=True)
    record = stack.wait_settled("inl-2")
    assert record.state == "completed"
    assert received(stack, record.steps[3].effect_id)
    assert not received(stack, record.steps[1].effect_id)


def test_a_declined_inline_step_compensates_what_committed(inline_stack: Stack) -> None:
    stack = inline_stack
    stack.worker()
    start(stack, "inl-3", plan={"decline": ["c"]})
    record = stack.wait_settled("inl-3")
    assert record.state == "compensated"
    assert [s.state for s in record.steps] == ["compensated", "compensated", "failed"]
    assert len(stack.ops("undo", "inl-3")) == 2


def test_a_worker_killed_during_an_inline_body_leaves_it_ambiguous(inline_stack: Stack) -> None:
    """Crash semantics are a sent step's: claimed and silent past its time limit → review."""
    stack = inline_stack
    stack.worker()
    stack.beat()
    start(stack, "inl-4", plan={"block": {"b": "never"}})
    [began] = wait_until(lambda: stack.ops("b.start", "inl-4"), what="b began inline")
    os.kill(int(began["pid"]), signal.SIGKILL)  # the pool process running a's task, now b
    record = stack.wait_settled("inl-4", timeout=120)
    assert record.state == "manual-review"
    a, b = record.steps
    assert (a.state, b.state) == ("committed", "ambiguous")
    assert b.error_code == "worker_lost"
    assert len(stack.ops("b.start", "inl-4")) == 1  # never run twice


def test_a_warm_shutdown_finishes_the_inline_body_and_sends_the_next_step(
        inline_stack: Stack) -> None:
    """SIGTERM to the worker mid-chain (its main process only, as ``systemd`` with
    ``KillMode=mixed`` sends it): the running inline body finishes and settles, the next step
    goes through the broker to another worker, and every body runs exactly once."""
    stack = inline_stack
    first = stack.worker()
    start(stack, "inl-5", plan={"block": {"b": "go-b"}}, more=4)
    [began] = wait_until(lambda: stack.ops("b.start", "inl-5"), what="b began inline")
    os.kill(first.pid, signal.SIGTERM)
    wait_until(lambda: "Warm shutdown" in first.text(), what="the warm shutdown began")
    second = stack.worker()
    stack.release("go-b")
    record = stack.wait_settled("inl-5")
    assert record.state == "completed"
    assert first.proc.wait(timeout=30) == 0  # it exited once b's task ended
    a, b, c, *more = record.steps
    assert len(more) == 4
    starts = [e for e in stack.ledger() if e["op"].endswith(".start")]
    assert sorted(e["effect_id"] for e in starts) == sorted(s.effect_id for s in record.steps)
    assert all(s.attempts == 1 for s in record.steps)  # each body ran once
    pids = {e["effect_id"]: e["pid"] for e in starts}
    assert pids[a.effect_id] == pids[b.effect_id] == began["pid"]
    assert [e["op"] for e in stack.ops("b.done", "inl-5")] == ["b.done"]  # b finished
    assert received(stack, c.effect_id) and f"[{c.effect_id}] received" in second.text()
    assert pids[c.effect_id] != began["pid"]
    assert len({pids[s.effect_id] for s in (c, *more)}) == 1  # the rest inline on the other worker
    assert "worker is shutting down; step" in first.text()
