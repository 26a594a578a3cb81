"""Parallel branches (ctx.parallel, docs/design.md): branches are recorded with one write and sent
together; results come back in call order; when one branch fails the others still in flight
are waited for (unclaimed ones abandoned) before every committed branch is compensated in
reverse commit order."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import CardDeclined, Shop, kinds

A, B, C = "shop.reserve", "shop.reserve#2", "shop.charge"


@pytest.fixture
def results_seen(shop: Shop) -> list[Any]:
    """Define saga 'fan-out' (reserve a, reserve b, charge in parallel); collect its results."""
    tasks = shop.tasks
    seen: list[Any] = []

    @shop.sagas.saga("fan-out")
    def run(ctx: Any, _: Any) -> Any:
        results = ctx.parallel(
            ctx.call(tasks["reserve"], "sku-a", 1),
            ctx.call(tasks["reserve"], "sku-b", 2),
            ctx.call(tasks["charge"], "card", 5),
        )
        seen.append(results)
        return results

    return seen


def _fan_out(shop: Shop) -> dict[str, Any]:
    """Start fan-out, return the three branch messages by step name."""
    shop.sagas.start("fan-out", {}, saga_id="p-1")
    return {m.step or "": m for m in shop.driver.take()}


def test_all_branches_are_recorded_together_and_sent_in_one_batch(
    shop: Shop, results_seen: list[Any]
) -> None:
    # when
    shop.sagas.start("fan-out", {}, saga_id="p-1")

    # then
    assert kinds(shop.driver.take()) == [("step", A), ("step", B), ("step", C)]
    record = shop.record("p-1")
    assert record.version == 1  # created with all three intents
    assert [s.state for s in record.steps] == [StepState.EXECUTING] * 3


def test_results_come_back_in_call_order_whatever_the_commit_order(
    shop: Shop, results_seen: list[Any]
) -> None:
    # given
    messages = _fan_out(shop)

    # when
    for name in (C, B, A):
        shop.driver.deliver(messages[name])

    # then
    assert shop.record("p-1").state == SagaState.COMPLETED
    assert results_seen == [[{"reservation": "r-sku-a"}, {"reservation": "r-sku-b"}, {"charge": "ch-card"}]]


def test_the_saga_waits_until_every_branch_committed(shop: Shop, results_seen: list[Any]) -> None:
    # given
    messages = _fan_out(shop)

    # when
    shop.driver.deliver(messages[A])
    shop.driver.deliver(messages[B])

    # then
    assert shop.record("p-1").state == SagaState.RUNNING
    assert results_seen == []
    assert shop.driver.take() == []


def test_a_failed_branch_abandons_an_unclaimed_one_whose_body_never_runs(
    shop: Shop, results_seen: list[Any]
) -> None:
    # given: B committed, A's message still queued
    messages = _fan_out(shop)
    shop.driver.deliver(messages[B])
    shop.script.then("charge", CardDeclined())

    # when
    shop.driver.deliver(messages[C])
    shop.driver.deliver(messages[A])
    shop.driver.run_until_idle()

    # then
    a = shop.step(A, "p-1")
    assert (a.state, a.error_code) == (StepState.FAILED, "not_started")
    assert shop.record("p-1").state == SagaState.COMPENSATED
    assert [c.args for c in shop.script.of("reserve")] == [("sku-b", 2)]
    assert [c.args for c in shop.script.of("release")] == [("sku-b", 2)]


def test_a_failed_branch_waits_for_a_claimed_one_then_compensates_in_reverse_commit_order(
    shop: Shop, results_seen: list[Any]
) -> None:
    # given: B commits first; then, while A's body runs, C is declined
    messages = _fan_out(shop)
    shop.clock.advance(1)
    shop.driver.deliver(messages[B])
    shop.script.then("charge", CardDeclined())
    while_a_ran: dict[str, Any] = {}

    def decline_c_while_a_runs() -> dict[str, str]:
        shop.clock.advance(1)
        shop.driver.deliver(messages[C])
        while_a_ran["state"] = shop.record("p-1").state
        while_a_ran["sent"] = shop.driver.take()
        shop.clock.advance(1)
        return {"reservation": "r-sku-a"}

    shop.script.then("reserve", decline_c_while_a_runs)

    # when
    shop.driver.deliver(messages[A])
    shop.driver.run_until_idle()

    # then: nothing was undone while A ran; then A (newest commit) is undone before B
    assert while_a_ran == {"state": SagaState.COMPENSATING, "sent": []}
    assert shop.record("p-1").state == SagaState.COMPENSATED
    assert [c.args for c in shop.script.of("release")] == [("sku-a", 1), ("sku-b", 2)]
    assert shop.step(C, "p-1").state == StepState.FAILED


def test_a_failed_branch_with_all_others_unclaimed_compensates_nothing(
    shop: Shop, results_seen: list[Any]
) -> None:
    # given
    messages = _fan_out(shop)
    shop.script.then("charge", CardDeclined())

    # when
    shop.driver.deliver(messages[C])
    shop.driver.run_until_idle()
    shop.driver.deliver(messages[A])
    shop.driver.deliver(messages[B])

    # then
    assert shop.record("p-1").state == SagaState.COMPENSATED
    assert shop.script.names() == ["charge"]


def test_an_ambiguous_branch_sends_the_saga_to_review_once_the_others_settle(
    shop: Shop, results_seen: list[Any]
) -> None:
    # given: C's outcome is unknown while B is queued
    messages = _fan_out(shop)
    shop.driver.deliver(messages[A])
    shop.script.then("charge", ConnectionError("reset"))

    # when
    shop.driver.deliver(messages[C])
    running_while_b_queued = shop.record("p-1").state
    shop.driver.deliver(messages[B])

    # then
    assert running_while_b_queued == SagaState.RUNNING
    record = shop.record("p-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_step")
    assert shop.script.of("release") == []
