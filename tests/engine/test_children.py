"""Child sagas in the engine (docs/design.md §3.7): a child's end settles its parent's step; a
compensated child fails it; a parent compensating undoes a completed child as a unit, in
reverse order with its own steps; the sweep repairs a lost start or a lost report."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._records import ParentRef, SagaState, StepState
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import Shop, register_shop


def _define(shop: Shop) -> dict[str, Any]:
    reserve, charge, ship = (shop.tasks[n] for n in ("reserve", "charge", "ship"))

    @shop.sagas.saga("payment")
    def payment(ctx: Any, data: dict[str, Any]) -> Any:
        charged = ctx.step(charge, data["card"], data["total"])
        return {"paid": charged["charge"]}

    @shop.sagas.saga("trip")
    def trip(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "seat", 1)
        paid = ctx.child(payment, {"card": data["card"], "total": 10})
        ctx.step(ship, "t-1", paid["paid"])
        return paid

    @shop.sagas.saga("fan-out")
    def fan_out(ctx: Any, data: dict[str, Any]) -> Any:
        calls = [ctx.call_child("payment", {"card": f"c{i}", "total": i}) for i in range(data["n"])]
        return [r["paid"] for r in ctx.parallel(*calls)]

    return {"payment": payment, "trip": trip, "fan-out": fan_out}


def test_a_child_that_completes_hands_its_result_to_the_parent(shop: Shop) -> None:
    # given
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")

    # when
    shop.driver.run_until_idle()

    # then
    parent, child = shop.record("trip-1"), shop.record("trip-1/2")
    assert (parent.state, child.state) == (SagaState.COMPLETED, SagaState.COMPLETED)
    assert parent.steps[1].name == "child:payment"
    assert parent.steps[1].result == child.result == {"paid": "ch-visa"}
    assert parent.result == {"paid": "ch-visa"}
    assert child.parent == ParentRef("trip-1", "child:payment")
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_a_child_that_compensates_makes_the_parent_compensate(shop: Shop) -> None:
    # given
    shop.script.then("charge", StepNotCommitted("card_declined"))
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")

    # when
    shop.driver.run_until_idle()

    # then
    parent = shop.record("trip-1")
    assert shop.record("trip-1/2").state == SagaState.COMPENSATED
    assert (parent.state, parent.error_code) == (SagaState.COMPENSATED, "child_compensated")
    assert (parent.steps[1].state, parent.steps[1].error_code) == (StepState.FAILED,
                                                                   "child_compensated")
    assert shop.script.names() == ["reserve", "charge", "release"]


def test_a_parent_compensating_later_undoes_its_completed_child_in_reverse_order(shop: Shop) -> None:
    # given: the step after the child is declined
    shop.script.then("ship", StepNotCommitted("no_courier"))
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")

    # when
    shop.driver.run_until_idle()

    # then: the child (its charge refunded) is undone before the parent's own reserve
    parent, child = shop.record("trip-1"), shop.record("trip-1/2")
    assert (parent.state, child.state) == (SagaState.COMPENSATED, SagaState.COMPENSATED)
    assert child.error_code == "parent_compensating"
    assert parent.steps[1].state == StepState.COMPENSATED
    assert shop.script.names() == ["reserve", "charge", "ship", "refund", "release"]


def test_sixteen_children_in_parallel_all_complete(shop: Shop) -> None:
    # given
    _define(shop)["fan-out"].start({"n": 16}, saga_id="fan-1")

    # when
    shop.driver.run_until_idle()

    # then
    parent = shop.record("fan-1")
    assert parent.state == SagaState.COMPLETED
    assert parent.result == [f"ch-c{i}" for i in range(16)]
    assert {s.group for s in parent.steps} == {"parallel-1"}
    assert [shop.record(f"fan-1/{i + 1}").state for i in range(16)] == [SagaState.COMPLETED] * 16


def test_a_child_in_review_puts_the_parent_in_review_naming_it_until_it_ends(shop: Shop) -> None:
    # given: the child's charge is ambiguous
    shop.script.then("charge", RuntimeError("timeout after the request left"))
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")
    shop.driver.run_until_idle()
    parent = shop.record("trip-1")
    assert (parent.state, parent.error_code) == (SagaState.MANUAL_REVIEW, "child_in_review")
    assert "trip-1/2" in (parent.reason or "")

    # when: the operator settles the child
    charge = shop.record("trip-1/2").steps[0]
    shop.sagas.resolve("trip-1/2", step=charge.name, effect_id=charge.effect_id,
                       outcome="committed", result={"charge": "ch-x"})
    shop.sagas.resume("trip-1/2")
    shop.driver.run_until_idle()

    # then
    assert shop.record("trip-1").state == SagaState.COMPLETED


def test_cancelling_the_parent_cancels_its_running_child(shop: Shop) -> None:
    # given: the child's charge message is pending
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")
    shop.deliver_next()  # reserve commits; the child starts and sends its charge
    assert shop.record("trip-1/2").state == SagaState.RUNNING

    # when
    shop.sagas.cancel("trip-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("trip-1/2").state == SagaState.COMPENSATED
    assert shop.record("trip-1").state == SagaState.COMPENSATED
    assert "charge" not in shop.script.names()


def test_the_sweep_starts_a_child_whose_start_was_lost(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the process died between recording the child step and starting the child
    children = shop.sagas.engine.children
    monkeypatch.setattr(children, "start_all", lambda parent, steps: None)
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")
    shop.driver.run_until_idle()
    assert shop.sagas.get("trip-1/2") is None
    monkeypatch.undo()

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.record("trip-1").state == SagaState.COMPLETED


def test_the_sweep_reports_a_child_whose_report_was_lost(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the child completed but its parent was never told
    children = shop.sagas.engine.children
    real_report = children.report
    monkeypatch.setattr(children, "report", lambda child: None)
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")
    shop.driver.run_until_idle()
    assert shop.record("trip-1/2").state == SagaState.COMPLETED
    assert shop.record("trip-1").steps[1].state == StepState.WAITING
    monkeypatch.setattr(children, "report", real_report)

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.record("trip-1").state == SagaState.COMPLETED


def test_a_child_id_owned_by_another_saga_sends_the_parent_to_review(shop: Shop) -> None:
    # given
    sagas = _define(shop)
    sagas["payment"].start({"card": "x", "total": 1}, saga_id="taken")

    @shop.sagas.saga("stubborn")
    def stubborn(ctx: Any, data: Any) -> Any:
        return ctx.child("payment", {"card": "y", "total": 2}, saga_id="taken")

    # when
    record = stubborn.start({}, saga_id="s-1").record
    shop.driver.run_until_idle()

    # then
    record = shop.record("s-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "child_id_taken")


def test_an_unknown_child_definition_is_a_bad_call(shop: Shop) -> None:
    @shop.sagas.saga("orphan")
    def orphan(ctx: Any, data: Any) -> Any:
        return ctx.child("nope", {})

    record = orphan.start({}, saga_id="o-9").record
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")


def test_a_run_that_returns_no_json_goes_to_review(shop: Shop) -> None:
    @shop.sagas.saga("objecty")
    def objecty(ctx: Any, data: Any) -> Any:
        return object()

    record = objecty.start({}, saga_id="obj-1").record
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_result")


def test_default_child_ids_live_in_their_parent_bucket(clock: Any, script: Any) -> None:
    # given: a store of 16 buckets
    sagas = Sagas(Celery("buckets", set_as_current=False), store=MemoryStore(buckets=16),
                  allow_non_durable=True, clock=clock)
    tasks, definitions = register_shop(sagas, script)
    shop = Shop(sagas, SagaDriver(sagas), clock, script, tasks, definitions)
    _define(shop)["fan-out"].start({"n": 16}, saga_id="fan-1")

    # when
    shop.driver.run_until_idle()

    # then
    parent = shop.record("fan-1")
    ids = [s.kwargs["saga_id"] for s in parent.steps]
    store = sagas.store
    assert parent.state == SagaState.COMPLETED
    assert all(store.bucket_of(i) == store.bucket_of("fan-1") for i in ids)
    assert all(i.split(".")[0] == f"fan-1/{n + 1}" for n, i in enumerate(ids))


def test_the_sweep_lifts_a_parent_review_whose_child_ended_unreported(
        shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the child went to review, then was settled while its report was lost
    shop.script.then("charge", RuntimeError("timeout after the request left"))
    _define(shop)["trip"].start({"card": "visa"}, saga_id="trip-1")
    shop.driver.run_until_idle()
    children = shop.sagas.engine.children
    real_report = children.report
    monkeypatch.setattr(children, "report", lambda child: None)
    charge = shop.record("trip-1/2").steps[0]
    shop.sagas.resolve("trip-1/2", step=charge.name, effect_id=charge.effect_id,
                       outcome="committed", result={"charge": "ch-x"})
    shop.sagas.resume("trip-1/2")
    shop.driver.run_until_idle()
    assert shop.record("trip-1").state == SagaState.MANUAL_REVIEW
    monkeypatch.setattr(children, "report", real_report)

    # when
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert shop.record("trip-1").state == SagaState.COMPLETED
