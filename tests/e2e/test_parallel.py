"""Parallel branches (ctx.parallel) on real prefork workers with a Redis broker and store.

The saga is ``e2e-fan-out`` of ``tests.e2e.parallel_app``: prepare, ``width`` branches of
``fan.reserve`` (slot 0 … width-1, named ``fan.reserve``, ``fan.reserve#2`` …), then finish.
Every body and undo leaves a ledger line with its effect id, so "exactly once" is counted on
what the provider saw, not on what the saga record says.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest

from celery_sagas._records import SagaRecord
from tests.e2e.conftest import Stack, wait_until
from tests.e2e.parallel_app import build

pytestmark = pytest.mark.e2e

UNDO_OPS = ("release", "unprepare")


@pytest.fixture
def fan_stack(redis_stack: Stack) -> Stack:
    """``redis_stack`` whose client and workers load ``tests.e2e.parallel_app``."""
    redis_stack.shop = build(redis_stack.config)
    redis_stack.app_module = "tests.e2e.parallel_app"
    return redis_stack


def start(stack: Stack, saga_id: str, width: int, **plan: Any) -> None:
    """Start one fan-out saga."""
    stack.shop.order.start({"id": saga_id, "width": width, "plan": plan}, saga_id=saga_id)


def branches(record: SagaRecord) -> list[Any]:
    """The branch step records, in call order."""
    return [s for s in record.steps if s.task == "fan.reserve"]


def effect_counts(stack: Stack, op: str, saga_id: str) -> Counter[str]:
    """How many ledger lines of ``op`` each effect id has."""
    return Counter(e["effect_id"] for e in stack.ops(op, saga_id))


def undone_once_newest_first(stack: Stack, record: SagaRecord) -> list[str]:
    """Check every committed step was undone exactly once, newest commit first; return names."""
    committed = {s.compensation_effect_id: s for s in record.steps if s.committed_at_ms is not None}
    undo = [e for e in stack.ledger() if e["op"] in UNDO_OPS and e["saga_id"] == record.saga_id]
    assert Counter(e["effect_id"] for e in undo) == Counter(dict.fromkeys(committed, 1))
    times = [committed[e["effect_id"]].committed_at_ms for e in undo]
    assert times == sorted(times, reverse=True), "undo must follow reverse order of commit"
    assert all(s.state in ("compensated", "failed") for s in record.steps), "something left open"
    return [committed[e["effect_id"]].name for e in undo]


def test_a_fan_out_of_8_completes_with_every_result_recorded(fan_stack: Stack) -> None:
    fan_stack.worker()
    start(fan_stack, "fan-8", 8)
    record = fan_stack.wait_settled("fan-8")
    assert record.state == "completed"
    assert [s.name for s in branches(record)] == ["fan.reserve"] + [f"fan.reserve#{i}" for i in range(2, 9)]
    assert [(s.state, s.result) for s in branches(record)] == [
        ("committed", {"slot": slot}) for slot in range(8)
    ]
    assert effect_counts(fan_stack, "reserve.done", "fan-8") == Counter(
        {s.effect_id: 1 for s in branches(record)}
    )
    [finish] = fan_stack.ops("finish.start", "fan-8")
    assert finish["slots"] == list(range(8))


def _overlapping_on_two_pids(runs: list[tuple[float, float, int]]) -> bool:
    """True when two bodies ran at the same time in two processes."""
    return any(
        a_pid != b_pid and a_start < b_end and b_start < a_end
        for i, (a_start, a_end, a_pid) in enumerate(runs)
        for b_start, b_end, b_pid in runs[i + 1:]
    )


def test_20_fan_outs_of_16_on_two_workers_lose_no_result_while_commits_race(fan_stack: Stack) -> None:
    fan_stack.worker()
    fan_stack.worker()
    ids = [f"race-{n}" for n in range(20)]
    for saga_id in ids:
        start(fan_stack, saga_id, 16, latency_ms=10)
    raced = 0
    for saga_id in ids:
        record = fan_stack.wait_settled(saga_id)
        assert record.state == "completed", (saga_id, record.reason)
        assert [s.result for s in branches(record)] == [{"slot": slot} for slot in range(16)]
        done = fan_stack.ops("reserve.done", saga_id)
        assert Counter(e["effect_id"] for e in done) == Counter({s.effect_id: 1 for s in branches(record)})
        assert [e["slots"] for e in fan_stack.ops("finish.start", saga_id)] == [list(range(16))]
        started = {e["effect_id"]: e["t"] for e in fan_stack.ops("reserve.start", saga_id)}
        raced += _overlapping_on_two_pids([(started[e["effect_id"]], e["t"], e["pid"]) for e in done])
    assert raced, "no saga ran two branches at once in two processes: nothing raced"


def test_a_branch_failing_while_another_runs_undoes_every_committed_step_once(fan_stack: Stack) -> None:
    fan_stack.worker()
    # Branch 4 declines only once branch 0 is running, whatever order the pool takes them in.
    start(fan_stack, "fail-1", 8, block={"reserve-0": "go", "reserve-4": "decline"},
          decline=["reserve-4"])
    wait_until(lambda: any(e.get("slot") == 0 for e in fan_stack.ops("reserve.start", "fail-1")),
               what="branch 0 running")
    fan_stack.release("decline")

    def others_settled() -> SagaRecord | None:
        record = fan_stack.sagas.get("fail-1")
        rest = [s.state for s in branches(record)[1:]]
        return record if record.state == "compensating" and "executing" not in rest else None

    record = wait_until(others_settled, what="every branch but the blocked one settled")
    assert branches(record)[0].state == "executing"
    assert [e for e in fan_stack.ledger() if e["op"] in UNDO_OPS] == []  # waits for slot 0
    fan_stack.release("go")
    record = fan_stack.wait_settled("fail-1")
    assert (record.state, record.error_code) == ("compensated", "declined")
    undone = undone_once_newest_first(fan_stack, record)
    assert (undone[0], undone[-1]) == ("fan.reserve", "fan.prepare")  # slot 0 committed last
    assert branches(record)[4].error_code == "declined"
    never_began = {s.effect_id for s in branches(record) if s.error_code == "not_started"}
    assert never_began.isdisjoint(e["effect_id"] for e in fan_stack.ops("reserve.start", "fail-1"))
    assert fan_stack.ops("finish.start", "fail-1") == []


def test_a_step_failing_after_the_fan_in_undoes_every_branch_and_earlier_step_once(
    fan_stack: Stack,
) -> None:
    fan_stack.worker()
    start(fan_stack, "fail-2", 8, decline=["finish"])
    record = fan_stack.wait_settled("fail-2")
    assert (record.state, record.error_code) == ("compensated", "declined")
    undone = undone_once_newest_first(fan_stack, record)
    assert sorted(undone) == sorted(["fan.prepare", *(s.name for s in branches(record))])
    assert undone[-1] == "fan.prepare"
    releases = {e["slot"]: e["result"] for e in fan_stack.ops("release", "fail-2")}
    assert releases == {slot: {"slot": slot} for slot in range(8)}


def test_a_branch_killed_mid_body_goes_to_review_after_the_others_settle_undoing_nothing(
    fan_stack: Stack,
) -> None:
    fan_stack.worker()
    start(fan_stack, "kill-1", 4, block={"reserve-1": "never", "reserve-2": "go"})

    def pids() -> dict[int, int]:
        return {e["slot"]: e["pid"] for e in fan_stack.ops("reserve.start", "kill-1")}

    def killed_one_judged() -> SagaRecord | None:
        record = fan_stack.sagas.get("kill-1")
        states = [s.state for s in branches(record)]
        return record if (states[1], states[3]) == ("ambiguous", "committed") else None

    wait_until(lambda: pids().keys() >= {1, 2}, what="branches 1 and 2 running")
    os.kill(pids()[1], signal.SIGKILL)
    record = wait_until(killed_one_judged, what="the killed branch judged ambiguous")
    assert (record.state, branches(record)[2].state) == ("running", "executing")
    fan_stack.release("go")
    record = fan_stack.wait_settled("kill-1")
    assert (record.state, record.error_code) == ("manual-review", "ambiguous_step")
    assert branches(record)[1].effect_id in (record.reason or "")
    assert [s.state for s in branches(record)] == ["committed", "ambiguous", "committed", "committed"]
    assert [e for e in fan_stack.ledger() if e["op"] in UNDO_OPS] == []
    assert effect_counts(fan_stack, "reserve.start", "kill-1")[branches(record)[1].effect_id] == 1
    assert fan_stack.ops("finish.start", "kill-1") == []
