"""A new step kind touches only the registry and a ``ctx`` method (docs/design.md §3.11).

The kind is defined here, in the test: a doorbell rings at a door and holds its saga (no task
runs it) until a signal named after the door answers it, or until its deadline passes with no
answer, when its ``ctx`` method raises and the saga rolls back. Registered with
``kinds.register`` and recorded through ``SagaContext.hold``, it is held, woken, timed out,
abandoned by a cancel, listed among a saga's waits and drawn by the timeline, with no other
module of the package told about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._protocol import kinds
from celery_sagas._protocol.decisions import Wait, Wake
from celery_sagas._records import HistoryEvent, SagaRecord, SagaState, StepRecord, StepState
from celery_sagas.web._attention import waits_of
from celery_sagas.web._timeline import timeline
from tests.engine.conftest import Shop


def _answer(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wake | Wait:
    """The doorbell's judge: the first unconsumed signal named after its door answers it; its
    deadline passing with none, nobody did."""
    door = step.kwargs.get("door")
    signal = next((s for s in saga.signals if s.name == door and s.consumed_by is None), None)
    if signal is not None:
        return Wake(step, {"answered": True, "by": signal.payload}, signal.signal_id)
    if step.wake_at_ms is not None and now_ms >= step.wake_at_ms:
        return Wake(step, {"answered": False})
    return Wait(step.wake_at_ms)


DOORBELL = kinds.StepKind(
    "doorbell", "tests.doorbell", kinds.WakesOn.SIGNAL, judge=_answer,
    waits_for=lambda step: step.kwargs.get("door"),
    caption=lambda step: f"ringing at the {step.kwargs.get('door')} door", deadline="gives up")


class NobodyHome(StepNotCommitted):
    """Nobody answered the door in time."""


def ring(ctx: Any, door: str, within_s: int) -> Any:
    """The doorbell's ``ctx`` method: ring at ``door``; who answered (NobodyHome: nobody did)."""
    answer = ctx.hold(DOORBELL, {"door": door}, step_name=f"ring:{door}",
                      timeout_ms=within_s * 1000)
    if not answer["answered"]:
        raise NobodyHome("nobody_home")
    return answer["by"]


@pytest.fixture(autouse=True)
def doorbell() -> Iterator[kinds.StepKind]:
    kinds.register(DOORBELL)
    yield DOORBELL
    kinds.unregister(DOORBELL)


def _visitor(shop: Shop) -> Any:
    reserve, charge = shop.tasks["reserve"], shop.tasks["charge"]

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        who = ring(ctx, "front", within_s=30)
        return ctx.step(charge, "card-1", who["amount"])

    return shop.sagas.saga("visitor")(run)


def _ringing(shop: Shop) -> SagaRecord:
    _visitor(shop).start({}, saga_id="v-1")
    shop.driver.run_until_idle()
    return shop.record("v-1")


def test_a_new_kind_holds_its_saga_without_a_task(shop: Shop) -> None:
    # when
    record = _ringing(shop)

    # then: recorded under its task, waiting, its deadline the saga's due time; nothing queued
    bell = record.steps[1]
    assert (bell.name, bell.task, bell.state) == ("ring:front", "tests.doorbell", StepState.WAITING)
    assert kinds.kind_of(bell) is DOORBELL
    assert bell.wake_at_ms == record.steps[0].committed_at_ms + 30_000  # type: ignore[operator]
    assert shop.sagas.store.get("saga", "v-1").due_at_ms == bell.wake_at_ms  # type: ignore[union-attr]
    assert shop.driver.take() == []
    assert bell.execution is None  # a held step is no side effect: no effect marks
    # and a sweep before the deadline leaves it alone
    shop.clock.advance(29_000)
    shop.sagas.sweep()
    assert shop.record("v-1").steps[1].state is StepState.WAITING


def test_a_new_kind_is_woken_as_its_judge_says(shop: Shop) -> None:
    # given
    _ringing(shop)

    # when: someone answers the front door
    shop.sagas.signal("v-1", "front", {"amount": 7})
    shop.driver.run_until_idle()

    # then: the bell committed with the answer, which run() read on replay
    record = shop.record("v-1")
    assert record.state is SagaState.COMPLETED
    assert record.steps[1].state is StepState.COMMITTED
    assert record.steps[1].result == {"answered": True, "by": {"amount": 7}}
    assert record.signals[0].consumed_by == "ring:front"
    assert [c.args for c in shop.script.calls if c.name == "charge"] == [("card-1", 7)]


def test_a_new_kind_times_out_and_its_saga_is_undone(shop: Shop) -> None:
    # given
    _ringing(shop)

    # when: the deadline passes with nobody at the door
    shop.clock.advance(30_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then: run() raised NobodyHome; reserve was undone, the bell had nothing to undo
    record = shop.record("v-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "nobody_home")
    assert record.steps[1].result == {"answered": False}
    assert shop.script.names() == ["reserve", "release"]


def test_a_cancel_abandons_a_held_step_of_a_new_kind(shop: Shop) -> None:
    # given
    _ringing(shop)

    # when
    shop.sagas.cancel("v-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record("v-1")
    assert record.state is SagaState.COMPENSATED
    assert (record.steps[1].state, record.steps[1].error_code) == (StepState.FAILED, "not_started")
    assert shop.script.names() == ["reserve", "release"]


def test_the_timeline_waits_and_history_show_a_new_kind(shop: Shop) -> None:
    # given
    record = _ringing(shop)
    now = shop.clock.now_ms()

    # when
    drawn = timeline(record, now)
    waits = waits_of(record)

    # then: its bar has the kind's class and caption; its deadline mark the kind's word
    [bar] = [b for b in drawn.bars if b.kind == "doorbell"]
    assert bar.title.startswith("ring:front: ringing at the front door, gives up at ")
    assert any(m.title.startswith("ring:front gives up at ") for m in drawn.marks)
    assert [(w.step, w.kind, w.what, w.until_ms) for w in waits] == [
        ("ring:front", "doorbell", "front", record.steps[1].wake_at_ms)]
    opened = [e for e in shop.sagas.history("v-1") if e.step == "ring:front"]
    assert [(e.event, e.state) for e in opened] == [(HistoryEvent.INTENT, "waiting")]


def test_a_kind_cannot_take_a_task_of_another_kind_or_run_on_a_worker() -> None:
    with pytest.raises(ValueError, match="sleep"):
        kinds.register(kinds.StepKind("nap", kinds.TIMER.task, kinds.WakesOn.DEADLINE))
    with pytest.raises(ValueError, match="held"):
        kinds.register(kinds.StepKind("job", "tests.job", kinds.WakesOn.WORKER))
    with pytest.raises(ValueError, match="built-in"):
        kinds.unregister(kinds.TIMER)
