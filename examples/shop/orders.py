"""The place-order saga: reserve stock, charge the card, ship."""

from __future__ import annotations

from typing import Any

from celery_sagas import SagaContext

from .app import sagas
from .tasks import charge_card, reserve_stock, ship


@sagas.saga("place-order")
def place_order(ctx: SagaContext, order: dict[str, Any]) -> dict[str, Any]:
    """Each ctx.step is a side effect with a compensator; a declined card undoes the rest."""
    stock = ctx.step(reserve_stock, order["sku"], order["qty"])
    charge = ctx.step(charge_card, order["card"], order["total"])
    shipment = ctx.step(ship, order["id"], stock["reservation"])
    return {"charge": charge["charge"], "tracking": shipment["tracking"]}
