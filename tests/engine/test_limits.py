"""Limits that hold by construction (docs/concepts.md "Limits"): child depth and count stop a
runaway tree before a child exists, the parent compensates; a saga tree of any depth or width
is cancelled and compensated in a loop, never by recursion; unconsumed signals are bounded in
count and bytes, refused before anything is written; a final saga takes no signal; a saga at
its size limit can still be cancelled."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._protocol import moves
from celery_sagas._protocol.notes import SignalNote
from celery_sagas._records import SAGA, SagaState, StepState
from celery_sagas._repository import Plan
from celery_sagas.errors import (
    PayloadTooLarge,
    SagaAlreadyFinal,
    SagaConfigurationError,
    SignalLimitExceeded,
)
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver


def dump(store: MemoryStore) -> dict[Any, Any]:
    """Every record of the store, envelope and notes, as compared before and after a call."""
    return {key: (e.version, e.state, e.body, e.notes) for key, e in store._records.items()}


@pytest.fixture
def limited(app: Celery, store: MemoryStore, clock: FrozenClock) -> Sagas:
    """Sagas with small limits, so a test reaches each of them."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock, child_depth_limit=3,
                 children_limit=5, signal_limit=3, signal_bytes_limit=200)


@pytest.fixture
def tree(limited: Sagas) -> Iterator[dict[str, Any]]:
    """Definitions that build trees: a saga that starts itself as its child, a fan-out of
    waiting children, and a saga waiting for signals."""

    @limited.step(name="t.book", compensate="t.unbook")
    def book(n: int, *, saga: Any = None) -> Any:
        return {"booked": n}

    @limited.compensator(name="t.unbook")
    def unbook(n: int, *, result: Any = None, saga: Any = None) -> None:
        return None

    @limited.saga("again")
    def again(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.wait_signal("go") if data.get("wait") else None
        return ctx.child("again", data)

    @limited.saga("leaf")
    def leaf(ctx: Any, data: dict[str, Any]) -> Any:
        if data.get("wait"):
            ctx.wait_signal("go")
        return data["n"]

    @limited.saga("fan")
    def fan(ctx: Any, data: dict[str, Any]) -> Any:
        calls = [ctx.call_child("leaf", {"n": i, "wait": data["wait"]}) for i in range(data["n"])]
        done = ctx.parallel(*calls)
        ctx.wait_signal("fail") if data.get("then_fail") else None
        return done

    @limited.saga("waiter")
    def waiter(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(book, 1)
        return ctx.wait_signal("go")

    yield {"again": again, "fan": fan, "waiter": waiter}


def states(sagas: Sagas, store: MemoryStore) -> dict[str, SagaState]:
    return {e.id: SagaState(e.state) for (kind, _), e in store._records.items() if kind == SAGA}


# ---------------------------------------------------------------- children


def test_a_saga_that_starts_itself_stops_at_the_depth_limit_and_compensates(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given
    driver = SagaDriver(limited)

    # when
    tree["again"].start({}, saga_id="r")
    driver.run_until_idle(max_messages=500)

    # then: the root and three levels of children, no fourth; all rolled back
    ids = sorted(states(limited, store))
    assert ids == ["r", "r/1", "r/1/1", "r/1/1/1"]
    assert set(states(limited, store).values()) == {SagaState.COMPENSATED}
    deepest = limited.get("r/1/1/1")
    assert deepest is not None
    assert (deepest.steps[0].state, deepest.steps[0].error_code) == (StepState.FAILED,
                                                                      "child_depth_exceeded")
    assert deepest.error_code == "child_depth_exceeded"
    root = limited.get("r")
    assert root is not None and root.error_code == "child_compensated"


@pytest.mark.parametrize(("definition", "data", "says"), [
    ("again", {}, "child_depth_exceeded (past sagas_child_depth_limit = 3)"),
    ("fan", {"n": 6, "wait": False}, "too_many_children (past sagas_children_limit = 5)"),
])
def test_a_refused_child_step_is_logged_naming_the_setting_and_its_value(
        limited: Sagas, tree: dict[str, Any], caplog: pytest.LogCaptureFixture, definition: str,
        data: dict[str, Any], says: str) -> None:
    # given
    driver = SagaDriver(limited)

    # when
    with caplog.at_level(logging.WARNING, logger="celery_sagas.children"):
        tree[definition].start(data, saga_id="r")
        driver.run_until_idle(max_messages=500)

    # then
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals and all(says in line for line in refusals), refusals


def test_one_child_more_than_the_limit_fails_its_step_and_the_parent_compensates(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given
    driver = SagaDriver(limited)

    # when
    tree["fan"].start({"n": 6, "wait": False}, saga_id="f")
    driver.run_until_idle()

    # then: five children exist, the sixth was never created
    parent = limited.get("f")
    assert parent is not None
    assert (parent.state, parent.error_code) == (SagaState.COMPENSATED, "too_many_children")
    assert [s.error_code for s in parent.steps if s.state is StepState.FAILED] == ["too_many_children"]
    assert sorted(states(limited, store)) == ["f", *[f"f/{i}" for i in range(1, 6)]]


def test_a_cancel_at_the_depth_limit_compensates_every_level(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given: a chain three levels deep, the deepest waiting for a signal
    driver = SagaDriver(limited)
    tree["again"].start({"wait": False}, saga_id="c")
    driver.run_until_idle()

    # when
    limited.cancel("c")
    driver.run_until_idle()

    # then
    assert set(states(limited, store).values()) == {SagaState.COMPENSATED}


@pytest.fixture
def deep(app: Celery, store: MemoryStore, clock: FrozenClock) -> Iterator[Sagas]:
    """Sagas that build trees by depth and width, under a Python stack too small for a walk
    that recursed once per saga of the tree (or per level of a deep one)."""
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, child_depth_limit=100,
                  children_limit=200)

    @sagas.saga("tree")
    def grow(ctx: Any, data: dict[str, Any]) -> Any:
        if data["depth"] == 0:
            return ctx.wait_signal("go") if data["wait"] else "leaf"
        below = {**data, "depth": data["depth"] - 1}
        done = ctx.parallel(*[ctx.call_child("tree", below) for _ in range(data["width"])])
        if data.get("hold") and data["depth"] == data["hold"]:
            ctx.wait_signal("fail")
        return len(done)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        yield sagas
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("wait", [True, False], ids=["running", "completed"])
def test_cancelling_a_tree_of_a_thousand_descendants_compensates_each(
        deep: Sagas, store: MemoryStore, wait: bool) -> None:
    # given: ten children, a hundred grandchildren, a thousand leaves; running (waiting for a
    # signal) or all completed while the root still waits
    deep.start("tree", {"depth": 3, "width": 10, "wait": wait, "hold": 3}, saga_id="t")
    assert len(states(deep, store)) == 1111

    # when
    deep.cancel("t")

    # then
    assert set(states(deep, store).values()) == {SagaState.COMPENSATED}


def test_a_parent_compensating_many_completed_children_undoes_each_in_a_loop(
        deep: Sagas, store: MemoryStore) -> None:
    # given: 150 completed children, each undone in turn when the parent turns back
    deep.start("tree", {"depth": 1, "width": 150, "wait": False, "hold": 1}, saga_id="w")

    # when
    deep.cancel("w")

    # then
    found = states(deep, store)
    assert len(found) == 151
    assert set(found.values()) == {SagaState.COMPENSATED}


def test_a_chain_at_a_depth_limit_of_a_hundred_is_cancelled_in_a_loop(
        deep: Sagas, store: MemoryStore) -> None:
    # given: a chain a hundred children deep, the deepest waiting
    deep.start("tree", {"depth": 100, "width": 1, "wait": True}, saga_id="d")
    assert len(states(deep, store)) == 101

    # when
    deep.cancel("d")

    # then
    assert set(states(deep, store).values()) == {SagaState.COMPENSATED}


# ---------------------------------------------------------------- signals


def test_the_signal_past_the_count_limit_is_refused_and_writes_nothing(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given: three signals nobody waits for
    tree["waiter"].start({}, saga_id="s")
    for i in range(3):
        limited.signal("s", "other", i)
    before = dump(store)

    # when
    with pytest.raises(SignalLimitExceeded) as raised:
        limited.signal("s", "other", 4)

    # then
    assert raised.value.setting == "sagas_signal_limit"
    assert "sagas_signal_limit" in str(raised.value)
    assert dump(store) == before


def test_the_signal_past_the_byte_limit_is_refused_and_writes_nothing(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given
    tree["waiter"].start({}, saga_id="s")
    limited.signal("s", "other", "x" * 150)
    before = dump(store)

    # when
    with pytest.raises(SignalLimitExceeded) as raised:
        limited.signal("s", "other", "y" * 60)

    # then
    assert raised.value.setting == "sagas_signal_bytes_limit"
    assert dump(store) == before


def test_a_consumed_signal_no_longer_counts_against_the_limit(
        limited: Sagas, tree: dict[str, Any]) -> None:
    # given
    driver = SagaDriver(limited)
    tree["waiter"].start({}, saga_id="s")
    driver.run_until_idle()
    for i in range(2):
        limited.signal("s", "other", i)

    # when: the third is consumed at once
    limited.signal("s", "go", "now")
    driver.run_until_idle()

    # then
    record = limited.get("s")
    assert record is not None and record.state is SagaState.COMPLETED


def test_a_signal_to_a_final_saga_is_refused_unless_it_repeats_one_it_holds(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given
    driver = SagaDriver(limited)
    tree["waiter"].start({}, saga_id="s")
    driver.run_until_idle()
    limited.signal("s", "go", 1, signal_id="hook-1")
    driver.run_until_idle()
    before = dump(store)

    # when / then
    with pytest.raises(SagaAlreadyFinal) as raised:
        limited.signal("s", "go", 2)
    assert (raised.value.saga_id, raised.value.state) == ("s", "completed")
    assert limited.signal("s", "go", 1, signal_id="hook-1").state is SagaState.COMPLETED
    assert dump(store) == before


def test_a_signal_that_would_take_the_record_past_its_size_limit_writes_nothing(
        app: Celery, store: MemoryStore, clock: FrozenClock) -> None:
    # given: signals within their own limits, a record that cannot hold one more
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, payload_limit=4096,
                  signal_bytes_limit=100_000)

    @sagas.saga("idle")
    def idle(ctx: Any, data: Any) -> Any:
        return ctx.wait_signal("never")

    idle.start({}, saga_id="s")
    for _ in range(3):
        sagas.signal("s", "other", "x" * 900)
    before = dump(store)

    # when
    with pytest.raises(PayloadTooLarge) as raised:
        sagas.signal("s", "other", "x" * 900)

    # then
    assert "signal payload" in str(raised.value)
    assert dump(store) == before


def test_a_saga_over_its_size_limit_in_unconsumed_signals_can_be_cancelled(
        limited: Sagas, store: MemoryStore, tree: dict[str, Any]) -> None:
    # given: signals written as notes past every limit (as a process with higher limits did)
    driver = SagaDriver(limited)
    tree["waiter"].start({}, saga_id="s")
    driver.run_until_idle()
    for i in range(40):
        stored = {"payload": "z" * 30_000}
        store.annotate(SAGA, "s", SignalNote(f"sig-{i}", "other", stored, 1).text())
    assert len(json.dumps([n for n in store._records[(SAGA, "s")].notes])) > 1024 * 1024

    # when
    limited.cancel("s")
    driver.run_until_idle()

    # then: compensated, the signals dropped and counted
    record = limited.get("s")
    assert record is not None
    assert record.state is SagaState.COMPENSATED
    assert (record.signals, record.signals_dropped) == ((), 40)
    assert record.steps[0].state is StepState.COMPENSATED


@pytest.mark.parametrize("name, value", [
    ("child_depth_limit", 0), ("children_limit", True), ("signal_limit", "5"),
    ("signal_bytes_limit", -1),
])
def test_a_limit_that_is_not_a_positive_int_is_refused_naming_the_setting(
        app: Celery, name: str, value: Any) -> None:
    with pytest.raises(SagaConfigurationError, match=f"sagas_{name}"):
        Sagas(app, store=MemoryStore(), allow_non_durable=True, **{name: value})


@pytest.fixture
def swept(app: Celery, store: MemoryStore, clock: FrozenClock) -> Iterator[Sagas]:
    """The tree definition, with a one-hour retention, under a small Python stack."""
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, retention=3600,
                  child_depth_limit=100)

    @sagas.saga("tree")
    def grow(ctx: Any, data: dict[str, Any]) -> Any:
        if data["depth"] == 0:
            return ctx.wait_signal("go") if data["wait"] else "leaf"
        below = {**data, "depth": data["depth"] - 1}
        return len(ctx.parallel(*[ctx.call_child("tree", below) for _ in range(data["width"])]))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        yield sagas
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("depth, width, size", [(3, 10, 1111), (100, 1, 101)],
                         ids=["a thousand leaves", "a hundred deep"])
def test_the_sweep_cancels_a_tree_whose_cancel_stopped_at_the_root(
        swept: Sagas, store: MemoryStore, clock: FrozenClock, depth: int, width: int,
        size: int) -> None:
    # given: waiting leaves; the root's cancel was written, then the process died
    swept.start("tree", {"depth": depth, "width": width, "wait": True}, saga_id="t")
    engine = swept.engine
    engine.repository.update("t", lambda s: Plan(after=moves.cancel(s, engine.now())))
    clock.advance(60_000)

    # when
    swept.sweep()

    # then
    found = states(swept, store)
    assert len(found) == size
    assert set(found.values()) == {SagaState.COMPENSATED}


def test_retention_deletes_a_completed_tree_of_a_thousand_in_one_sweep(
        swept: Sagas, store: MemoryStore, clock: FrozenClock) -> None:
    # given
    swept.start("tree", {"depth": 3, "width": 10, "wait": False}, saga_id="t")
    assert set(states(swept, store).values()) == {SagaState.COMPLETED}
    clock.advance(3_600_000 + 1)

    # when
    swept.sweep()

    # then
    assert states(swept, store) == {}


def _filler(sagas: Sagas, undone: list[int]) -> Any:
    """A saga of six steps, each returning ``size`` bytes, then a wait."""

    @sagas.step(name="s.big", compensate="s.undo")
    def big(n: int, size: int, *, saga: Any = None) -> str:
        return "x" * size

    @sagas.compensator(name="s.undo")
    def undo(n: int, size: int, *, result: Any = None, saga: Any = None) -> None:
        undone.append(n)

    @sagas.saga("fill")
    def fill(ctx: Any, data: dict[str, Any]) -> Any:
        for i in range(6):
            ctx.step(big, i, data["size"])
        return ctx.wait_signal("go")

    return fill


@pytest.mark.parametrize("size", [350, 490, 650])
def test_a_result_too_large_for_a_record_at_its_limit_sends_the_saga_to_review(
        app: Celery, store: MemoryStore, clock: FrozenClock, size: int) -> None:
    # given
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, payload_limit=4096)
    fill = _filler(sagas, [])
    driver = SagaDriver(sagas)

    # when: a step's result does not fit in the record any more
    fill.start({"size": size}, saga_id="f")
    driver.run_until_idle()

    # then: an operator is asked (the step's outcome kept as unknown, or the next step's
    # arguments refused); the delivery did not fail
    record = sagas.get("f")
    assert record is not None and record.state is SagaState.MANUAL_REVIEW
    assert "payload_too_large" in {record.error_code, *(s.error_code for s in record.steps)}


def test_a_saga_at_its_size_limit_is_cancelled_and_compensated(
        app: Celery, store: MemoryStore, clock: FrozenClock) -> None:
    # given: committed steps whose results bring the record to its limit (the next one would
    # not fit: the saga waits in review)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, payload_limit=4096)
    undone: list[int] = []
    fill = _filler(sagas, undone)
    driver = SagaDriver(sagas)
    fill.start({"size": 430}, saga_id="f")
    driver.run_until_idle()
    held = sagas.get("f")
    assert held is not None and held.error_code == "payload_too_large"
    committed = [s.args[0] for s in held.steps if s.state is StepState.COMMITTED]
    assert len(committed) >= 4

    # when
    sagas.cancel("f")
    driver.run_until_idle()

    # then
    record = sagas.get("f")
    assert record is not None
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "cancelled")
    assert undone == committed[::-1]
