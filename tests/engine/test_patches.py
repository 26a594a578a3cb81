"""Versioning in-flight sagas with ``ctx.patched`` (docs/design.md §3.6): a deploy changes the
steps of a definition; sagas that passed the changed point keep their old path, new ones (and
old ones that had not reached it yet) take the new one, and none goes to review."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._records import SagaState
from tests.engine.conftest import Shop

NAME = "patched-order"


def _old(shop: Shop) -> Any:
    reserve, charge, ship = (shop.tasks[n] for n in ("reserve", "charge", "ship"))

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        ctx.step(charge, "card-1", 10)
        return ctx.step(ship, data["id"], "r")

    return run


def _new(shop: Shop) -> Any:
    reserve, charge, ship, notify = (shop.tasks[n] for n in ("reserve", "charge", "ship", "notify"))

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        if ctx.patched("notify-before-charge"):
            ctx.step(notify, "user-1")
        ctx.step(charge, "card-1", 10)
        return ctx.step(ship, data["id"], "r")

    return run


def _always_notify(shop: Shop) -> Any:
    """The new path without the patch check: what the runbook's last step deploys."""
    reserve, charge, ship, notify = (shop.tasks[n] for n in ("reserve", "charge", "ship", "notify"))

    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(reserve, "sku-1", 1)
        ctx.step(notify, "user-1")
        ctx.step(charge, "card-1", 10)
        return ctx.step(ship, data["id"], "r")

    return run


def _deploy(shop: Shop, run: Any) -> None:
    """Swap the definition's code in this process, as a restart on new code would."""
    registry = shop.sagas.registry
    registry.definitions[NAME] = replace(registry.definitions[NAME], run=run)


def test_a_saga_past_the_patch_keeps_its_old_path_and_a_new_one_takes_the_new(shop: Shop) -> None:
    # given: an old saga whose charge is recorded (past the patch point) under the old code
    shop.sagas.saga(NAME)(_old(shop))
    shop.sagas.start(NAME, {"id": "old"}, saga_id="old")
    shop.deliver_next()  # reserve commits, charge's intent is recorded

    # when: the new code is deployed, a new saga starts, and both run to the end
    _deploy(shop, _new(shop))
    shop.sagas.start(NAME, {"id": "new"}, saga_id="new")
    shop.driver.run_until_idle()

    # then
    old, new = shop.record("old"), shop.record("new")
    assert (old.state, new.state) == (SagaState.COMPLETED, SagaState.COMPLETED)
    assert [s.name for s in old.steps] == ["shop.reserve", "shop.charge", "shop.ship"]
    assert [s.name for s in new.steps] == ["shop.reserve", "shop.notify", "shop.charge", "shop.ship"]
    assert (old.patches, new.patches) == ((), ("notify-before-charge",))


def test_a_saga_that_had_not_reached_the_patch_takes_the_new_path(shop: Shop) -> None:
    # given: reserve is still in flight under the old code
    shop.sagas.saga(NAME)(_old(shop))
    shop.sagas.start(NAME, {"id": "mid"}, saga_id="mid")

    # when
    _deploy(shop, _new(shop))
    shop.driver.run_until_idle()

    # then
    record = shop.record("mid")
    assert record.state == SagaState.COMPLETED
    assert "shop.notify" in [s.name for s in record.steps]
    assert record.patches == ("notify-before-charge",)


def test_without_the_patch_the_same_change_sends_the_old_saga_to_review(shop: Shop) -> None:
    # given
    shop.sagas.saga(NAME)(_old(shop))
    shop.sagas.start(NAME, {"id": "old"}, saga_id="old")
    shop.deliver_next()

    # when
    _deploy(shop, _always_notify(shop))
    shop.driver.run_until_idle()

    # then
    record = shop.record("old")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "nondeterministic")


def test_a_recorded_patch_stays_true_on_every_later_replay(shop: Shop) -> None:
    # given: a new saga passed the patch; then the old branch is removed (runbook step 3)
    shop.sagas.saga(NAME)(_new(shop))
    shop.sagas.start(NAME, {"id": "n"}, saga_id="n")
    shop.deliver_next()  # reserve

    # when
    _deploy(shop, _always_notify(shop))
    shop.driver.run_until_idle()

    # then
    assert shop.record("n").state == SagaState.COMPLETED


@pytest.mark.parametrize("change_id", ["", "has space", 7])
def test_a_bad_change_id_sends_the_saga_to_review(shop: Shop, change_id: Any) -> None:
    # given
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.patched(change_id)

    # when
    record = shop.sagas.saga("bad-patch")(run).start({}, saga_id="b").record

    # then
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
