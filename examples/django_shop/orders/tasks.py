"""The order saga: reserve stock, charge the card, confirm the order; compensated in reverse.

Each step writes its effect and its effect-id row in one database transaction, so running it
again (a retry, a redelivered message) changes nothing: the steps are ``idempotent=True``, and
the saga may retry them instead of stopping for an operator.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from shop_site.celery import sagas

from celery_sagas import StepContext, StepNotCommitted

from .models import Order, Payment, Product, Reservation


@sagas.step(compensate="orders.release_stock", idempotent=True, name="orders.reserve_stock")
def reserve_stock(order_id: str, sku: str, qty: int, *, saga: StepContext) -> dict[str, int]:
    """Take ``qty`` of ``sku`` out of stock for the order (StepNotCommitted when short)."""
    with transaction.atomic():
        done = Reservation.objects.filter(effect_id=saga.effect_id).first()
        if done is None:
            if not Product.objects.filter(sku=sku, stock__gte=qty).update(stock=F("stock") - qty):
                raise StepNotCommitted("out_of_stock")
            done = Reservation.objects.create(effect_id=saga.effect_id, order_id=order_id, sku=sku,
                                              qty=qty)
    return {"reservation": done.pk}


@sagas.compensator(name="orders.release_stock", idempotent=True)
def release_stock(order_id: str, sku: str, qty: int, *, result: dict[str, int]) -> None:
    """Put the reserved stock back (once)."""
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().get(pk=result["reservation"])
        if not reservation.released:
            Product.objects.filter(sku=reservation.sku).update(stock=F("stock") + reservation.qty)
            reservation.released = True
            reservation.save(update_fields=["released"])


@sagas.step(compensate="orders.refund", idempotent=True, name="orders.charge")
def charge(order_id: str, card: str, total: int, *, saga: StepContext) -> dict[str, int]:
    """Charge the card (a card token starting with ``tok_declined`` is declined)."""
    if card.startswith("tok_declined"):
        raise StepNotCommitted("card_declined")
    payment, _ = Payment.objects.get_or_create(effect_id=saga.effect_id,
                                               defaults={"order_id": order_id, "amount": total})
    return {"payment": payment.pk}


@sagas.compensator(name="orders.refund", idempotent=True)
def refund(order_id: str, card: str, total: int, *, result: dict[str, int]) -> None:
    """Refund the charge (once)."""
    Payment.objects.filter(pk=result["payment"]).update(refunded=True)


@sagas.step(compensate=None, idempotent=True, name="orders.confirm")
def confirm(order_id: str) -> None:
    """Mark the order confirmed: the last step, nothing after it can fail."""
    Order.objects.filter(order_id=order_id).update(status="confirmed")


@sagas.saga("orders.place_order")
def place_order(ctx: Any, order: dict[str, Any]) -> None:
    """Reserve, charge, confirm."""
    ctx.step(reserve_stock, order["order_id"], order["sku"], order["qty"])
    ctx.step(charge, order["order_id"], order["card"], order["total"])
    ctx.step(confirm, order["order_id"])
