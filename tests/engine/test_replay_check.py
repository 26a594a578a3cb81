"""``sagas.replay_check()``: the deploy check replays this process's ``run`` against the sagas
in flight and reports the ones that would diverge, writing nothing (issue 29 item 6)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas.errors import SagaValidationError
from tests.engine.conftest import Shop


def _swap_run(shop: Shop, run: Any) -> None:
    """Deploy new code for place-order (what a new release of the process would register)."""
    registry = shop.sagas.registry
    registry.definitions["place-order"] = replace(registry.definitions["place-order"], run=run)


def _ship_before_charge(shop: Shop) -> Any:
    reserve, charge, ship = shop.tasks["reserve"], shop.tasks["charge"], shop.tasks["ship"]

    def run(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(reserve, order["sku"], order["qty"], warehouse="east")
        ctx.step(ship, order["id"], stock["reservation"])
        return ctx.step(charge, order["card"], order["total"])

    return run


def test_the_starting_code_passes_and_a_reordering_names_each_saga(shop: Shop,
                                                                   store: MemoryStore) -> None:
    # given: two orders charging (reserve committed), one not yet past its reserve
    for saga_id in ("o-1", "o-2"):
        shop.start_order(saga_id)
    shop.deliver_next()  # both reserves commit; both charges recorded
    shop.start_order("o-3")
    before = {e.id: e for e in store.scan("saga", ["running"], limit=100).items}
    shop.driver.take()  # what the starts sent

    # when
    same = shop.sagas.replay_check()
    _swap_run(shop, _ship_before_charge(shop))
    reordered = shop.sagas.replay_check(definition="place-order")

    # then
    assert (same.ok, same.checked, same.divergences) == (True, 3, ())
    assert not reordered.ok and reordered.checked == 3
    assert sorted(d.saga_id for d in reordered.divergences) == ["o-1", "o-2"]
    assert "shop.charge" in reordered.divergences[0].reason
    assert {e.id: e for e in store.scan("saga", ["running"], limit=100).items} == before
    assert shop.driver.take() == []  # nothing sent


def test_a_saga_rolling_back_is_not_checked_and_a_limit_bounds_the_work(shop: Shop) -> None:
    for saga_id in ("o-1", "o-2", "o-3"):
        shop.start_order(saga_id)
    shop.sagas.cancel("o-3")
    assert shop.sagas.replay_check().checked == 2
    assert shop.sagas.replay_check(limit=1).checked == 1


def test_a_definition_this_process_lacks_is_reported(shop: Shop) -> None:
    shop.start_order()
    del shop.sagas.registry.definitions["place-order"]
    [divergence] = shop.sagas.replay_check().divergences
    assert divergence.saga_id == "o-1" and "no saga definition" in divergence.reason


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_a_bad_limit_is_refused(shop: Shop, limit: Any) -> None:
    with pytest.raises(SagaValidationError):
        shop.sagas.replay_check(limit=limit)
