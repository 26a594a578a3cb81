"""Inventory, payment and shipping steps and their compensators.

Two payment providers: the primary acquirer declines ``risky-`` cards its fraud rules reject,
which the backup acquirer accepts (``orders.py`` tries it after a ``StepFailed``); both decline
``declined-`` cards. The carrier answers ``CarrierBusy`` (429) now and then (retried:
``retry_on``), and a ``flaky`` carrier times out after the label was bought, so nobody knows
whether it was: the label step is ``compensate_unknown``, and its cancel works by request id
whatever came of the purchase.
"""

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


class CarrierBusy(Exception):
    """The carrier answered 429 Too Many Requests (nothing was bought)."""


@sagas.step(compensate="shop.refund", not_committed_on=(CardDeclined,), name="shop.charge_card")
def charge_card(card: str, total: int, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Charge the card with the primary acquirer; a declined card provably charged nothing."""
    if card.startswith(("declined", "risky")):
        raise CardDeclined(card)
    key = saga.effect_id if saga else f"direct-{card}"
    return provider().call(key, "payments", "charge", {"charge": f"ch-{total}"})


@sagas.step(compensate="shop.refund", not_committed_on=(CardDeclined,), name="shop.charge_backup")
def charge_backup(card: str, total: int, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Charge the card with the backup acquirer (tried after the primary one declined)."""
    if card.startswith("declined"):
        raise CardDeclined(card)
    key = saga.effect_id if saga else f"direct-backup-{card}"
    return provider().call(key, "backup-payments", "charge", {"charge": f"ch-b-{total}"})


@sagas.compensator(name="shop.refund")
def refund(card: str, total: int, *, result: dict[str, Any], saga: StepContext) -> None:
    """Refund the charge, saying why (the step and code that turned the order back)."""
    provider().call(saga.effect_id, "payments", "refund",
                    {"refunded": result["charge"], "why": str(saga.reason)})


@sagas.step(compensate="shop.cancel_label", compensate_unknown=True, retry_on=(CarrierBusy,),
            retries=3, backoff=lambda attempt: 0.2 * attempt, name="shop.buy_label")
def buy_label(order_id: str, carrier: str, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Buy a shipping label; the effect id is the carrier's request id."""
    key = saga.effect_id if saga else f"direct-label-{order_id}"
    if carrier == "busy" and saga is not None and saga.attempt == 1:
        raise CarrierBusy("429 Too Many Requests")
    label = provider().call(key, "shipping", "label", {"label": f"lbl-{order_id}"})
    if carrier == "flaky":
        raise TimeoutError("the carrier did not answer")  # bought, but nobody knows it
    return label


@sagas.compensator(name="shop.cancel_label")
def cancel_label(order_id: str, carrier: str, *, saga: StepContext) -> None:
    """Cancel the label by its request id, whatever came of the purchase: when its outcome
    was unknown (``saga.outcome == "unknown"``) there may be nothing to cancel."""
    if saga.outcome == "unknown" and not provider().has(saga.forward_effect_id or ""):
        return  # the purchase never reached the carrier: nothing to undo
    provider().call(saga.effect_id, "shipping", "cancel-label",
                    {"cancelled": saga.forward_effect_id, "outcome": saga.outcome})


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
