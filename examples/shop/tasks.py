"""Inventory, payment and shipping steps and their compensators."""

from __future__ import annotations

from typing import Any

from celery_sagas import StepContext

from .app import sagas
from .provider import ProviderDeclined, provider


class CardDeclined(ProviderDeclined):
    """The card issuer refused the charge (nothing was charged)."""


@sagas.step(compensate="shop.release_stock", name="shop.reserve_stock")
def reserve_stock(sku: str, qty: int, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Reserve ``qty`` of ``sku``; the effect id is the inventory API's idempotency key."""
    key = saga.effect_id if saga else f"direct-{sku}"
    return provider().call(key, "inventory", "reserve", {"reservation": f"res-{sku}-{qty}"})


@sagas.compensator(name="shop.release_stock")
def release_stock(sku: str, qty: int, *, result: dict[str, Any], saga: StepContext) -> None:
    """Release the reservation made by reserve_stock."""
    provider().call(saga.effect_id, "inventory", "release", {"released": result["reservation"]})


@sagas.step(compensate="shop.refund", not_committed_on=(CardDeclined,), name="shop.charge_card")
def charge_card(card: str, total: int, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Charge the card; a declined card provably charged nothing."""
    if card.startswith("declined"):
        raise CardDeclined(card)
    key = saga.effect_id if saga else f"direct-{card}"
    return provider().call(key, "payments", "charge", {"charge": f"ch-{total}"})


@sagas.compensator(name="shop.refund")
def refund(card: str, total: int, *, result: dict[str, Any], saga: StepContext) -> None:
    """Refund the charge."""
    provider().call(saga.effect_id, "payments", "refund", {"refunded": result["charge"]})


@sagas.step(compensate="shop.cancel_shipment", name="shop.ship")
def ship(order_id: str, reservation: str, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Book the shipment of a reserved order."""
    key = saga.effect_id if saga else f"direct-{order_id}"
    return provider().call(key, "shipping", "ship", {"tracking": f"trk-{order_id}"})


@sagas.compensator(name="shop.cancel_shipment")
def cancel_shipment(order_id: str, reservation: str, *, result: dict[str, Any],
                    saga: StepContext) -> None:
    """Cancel the shipment."""
    provider().call(saga.effect_id, "shipping", "cancel", {"cancelled": result["tracking"]})
