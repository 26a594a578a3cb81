"""``StepFailed``: a step's known failure raised in ``run`` at its ``ctx.step`` call, which may
catch it and take another path (issue 29 item 2)."""

from __future__ import annotations

from typing import Any

from celery_sagas import StepFailed, StepNotCommitted
from celery_sagas._records import SagaState, StepState
from tests.engine.conftest import CardDeclined, Shop


def two_providers(shop: Shop) -> Any:
    """reserve, charge card A; on StepFailed charge card B instead; then ship."""
    reserve, charge, ship = shop.tasks["reserve"], shop.tasks["charge"], shop.tasks["ship"]
    caught: list[tuple[str, str, str]] = []

    @shop.sagas.saga("two-providers")
    def run(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(reserve, "sku-1", 1)
        try:
            paid = ctx.step(charge, "card-a", 30, step_name="charge-a")
        except StepFailed as failed:
            caught.append((failed.step, failed.code, failed.message))
            if order.get("give_up"):
                return {"paid": None}
            paid = ctx.step(charge, "card-b", 30, step_name="charge-b")
        ctx.step(ship, order["id"], stock["reservation"])
        return paid

    run.caught = caught  # type: ignore[attr-defined]
    return run


def test_a_caught_failure_takes_another_provider_and_completes(shop: Shop) -> None:
    # given: provider A declines the card
    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("insufficient funds"))

    # when
    definition.start({"id": "o-1"}, saga_id="p-1")
    shop.driver.run_until_idle()

    # then: provider B charged, shipped, completed; nothing compensated
    record = shop.record("p-1")
    assert (record.state, record.result) == (SagaState.COMPLETED, {"charge": "ch-card-b"})
    assert [s.state for s in record.steps] == [StepState.COMMITTED, StepState.FAILED,
                                               StepState.COMMITTED, StepState.COMMITTED]
    assert shop.script.names() == ["reserve", "charge", "charge", "ship"]
    assert definition.caught[0][:2] == ("charge-a", "card_declined")
    assert "insufficient funds" in definition.caught[0][2]
    assert not record.rolling_back


def test_every_replay_takes_the_same_except_path(shop: Shop) -> None:
    # given: a saga that caught the failure and recorded provider B's charge
    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("no"))
    definition.start({"id": "o-1"}, saga_id="p-1")
    shop.deliver_next()  # reserve
    shop.deliver_next()  # charge-a declined, charge-b recorded
    assert [s.name for s in shop.record("p-1").steps] == [
        "shop.reserve", "charge-a", "charge-b"]
    shop.driver.take()  # charge-b's message lost (the worker restarted)

    # when: the sweep finds it stale and sends it again
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then: the replay raised StepFailed at charge-a again and took the same path
    record = shop.record("p-1")
    assert record.state == SagaState.COMPLETED
    assert [s.name for s in record.steps] == ["shop.reserve", "charge-a", "charge-b", "shop.ship"]


def test_a_caught_failure_may_end_run_normally(shop: Shop) -> None:
    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("no"))
    definition.start({"id": "o-1", "give_up": True}, saga_id="p-1")
    shop.driver.run_until_idle()
    record = shop.record("p-1")
    assert (record.state, record.result) == (SagaState.COMPLETED, {"paid": None})
    assert "release" not in shop.script.names()


def test_an_uncaught_failure_compensates_as_before(shop: Shop) -> None:
    shop.script.then("charge", CardDeclined("no"))
    shop.start_order()
    shop.driver.run_until_idle()
    record = shop.record("o-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "card_declined")
    assert record.reason == "step 'shop.charge' did not commit (card_declined)"
    assert shop.script.names() == ["reserve", "charge", "release"]


def test_a_failure_after_a_caught_one_compensates_everything_committed(shop: Shop) -> None:
    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("no"))
    shop.script.then("ship", StepNotCommitted("no_courier"))
    definition.start({"id": "o-1"}, saga_id="p-1")
    shop.driver.run_until_idle()
    record = shop.record("p-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "no_courier")
    assert shop.script.names()[-2:] == ["refund", "release"]
    [refund] = shop.script.of("refund")
    assert refund.args == ("card-b", 30)  # the charge that committed, not the declined one
    assert str(refund.kwargs["saga"].reason) == "shop.ship: no_courier"


def test_the_history_says_run_caught_the_failure(shop: Shop) -> None:
    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("no"))
    definition.start({"id": "o-1"}, saga_id="p-1")
    shop.driver.run_until_idle()
    shop.sweep_when_stale()  # a later write (nothing to do) adds no second entry
    entries = [(str(e.event), e.step, e.code) for e in shop.sagas.history("p-1").entries]
    assert entries.count(("caught", "charge-a", "card_declined")) == 1
    failed_at = entries.index(("failed", "charge-a", "card_declined"))
    assert entries.index(("caught", "charge-a", "card_declined")) > failed_at


def test_show_lists_the_caught_failure_in_its_history(shop: Shop) -> None:
    from celery_sagas import _history_format as hfmt

    definition = two_providers(shop)
    shop.script.then("charge", CardDeclined("no"))
    definition.start({"id": "o-1"}, saga_id="p-1")
    shop.driver.run_until_idle()
    lines = hfmt.events_text(shop.sagas.history("p-1")).splitlines()
    assert [line.split()[1:4] for line in lines if " caught " in line] == [
        ["caught", "charge-a", "#1"]]
    [caught] = [line for line in lines if " caught " in line]
    assert "(card_declined)" in caught
