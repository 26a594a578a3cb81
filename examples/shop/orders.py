"""The place-order saga: reserve stock, charge the card (with a backup acquirer), buy a
shipping label, ship."""

from __future__ import annotations

from typing import Any

from celery_sagas import SagaContext, SignalTimeout, StepFailed

from .app import sagas
from .tasks import buy_label, charge_backup, charge_card, reserve_stock, ship

# Orders above this total need a manager's approval before the card is charged.
APPROVAL_LIMIT = 500
# How long a tracked order waits for the carrier's "delivered" webhook.
DELIVERY_TIMEOUT_S = 14 * 24 * 3600


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
    try:
        charge = ctx.step(charge_card, order["card"], order["total"])
    except StepFailed as declined:
        if declined.code != "card_declined":
            raise
        # the primary acquirer said no: try the backup one (declined there too: roll back)
        charge = ctx.step(charge_backup, order["card"], order["total"])
    ctx.step(buy_label, order["id"], order.get("carrier", "post"))
    shipment = ctx.step(ship, order["id"], stock["reservation"])
    outcome = {"charge": charge["charge"], "tracking": shipment["tracking"]}
    if order.get("track_delivery"):
        # Parked without a worker until the carrier's webhook signals it (POST /webhooks/carrier).
        try:
            outcome["delivery"] = ctx.wait_signal("delivered", timeout=DELIVERY_TIMEOUT_S)
        except SignalTimeout:
            outcome["delivery"] = "lost"  # a path of its own: no refund of a shipped order here
    return outcome
