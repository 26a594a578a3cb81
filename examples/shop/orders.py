"""The place-order saga: reserve stock, charge the card, ship."""

from __future__ import annotations

from typing import Any

from celery_sagas import SagaContext

from .app import sagas
from .tasks import charge_card, reserve_stock, ship

# Orders above this total need a manager's approval before the card is charged.
APPROVAL_LIMIT = 500


@sagas.saga("place-order")
def place_order(ctx: SagaContext, order: dict[str, Any]) -> dict[str, Any]:
    """Each ctx.step is a side effect with a compensator; a declined card undoes the rest."""
    stock = ctx.step(reserve_stock, order["sku"], order["qty"])
    if order["total"] > APPROVAL_LIMIT:
        ctx.approval(
            "manager-approval",
            capability="orders.large",
            tenant_id=order.get("tenant", "shop"),
            principal_id=order.get("customer", "customer"),
            target=order["id"],
        )
    charge = ctx.step(charge_card, order["card"], order["total"])
    shipment = ctx.step(ship, order["id"], stock["reservation"])
    return {"charge": charge["charge"], "tracking": shipment["tracking"]}
