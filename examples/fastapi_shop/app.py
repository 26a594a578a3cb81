"""The FastAPI shop's Celery app, steps and saga, configured from the environment.

    FASTAPI_SHOP_BROKER   broker URL  (default redis://127.0.0.1:6379/0)
    FASTAPI_SHOP_STORE    store URL   (default redis://127.0.0.1:6379/1: a Redis with an
                          append-only file, ``--appendonly yes --appendfsync everysec``; add
                          ``?require_aof=false`` for a development Redis without one)
    FASTAPI_SHOP_QUEUE    the queue the steps go to (default fastapi-shop)
    FASTAPI_SHOP_PREFIX   the store's key (Redis) or table (SQL) prefix (default fastapi_shop)

Run a worker and beat with ``celery -A examples.fastapi_shop.app worker -B -l INFO`` and the
web front with ``uvicorn examples.fastapi_shop.web:app``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_sagas import SagaContext, Sagas, StepContext, StepNotCommitted

app = Celery("fastapi_shop", broker=os.environ.get("FASTAPI_SHOP_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_serializer="json",
    task_default_queue=os.environ.get("FASTAPI_SHOP_QUEUE", "fastapi-shop"),
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
_prefix = os.environ.get("FASTAPI_SHOP_PREFIX", "fastapi_shop")
sagas = Sagas(app, store=os.environ.get("FASTAPI_SHOP_STORE", "redis://127.0.0.1:6379/1"),
              key_prefix=_prefix, table_prefix=f"{_prefix}_",
              sweep_interval=float(os.environ.get("FASTAPI_SHOP_SWEEP_INTERVAL", "5")))


@sagas.step(compensate="fastapi_shop.release", name="fastapi_shop.reserve")
def reserve(sku: str, qty: int, *, saga: StepContext | None = None) -> dict[str, Any]:
    """Hold ``qty`` of ``sku`` (the effect id is the inventory service's idempotency key)."""
    if qty <= 0:
        raise StepNotCommitted("bad_quantity")
    return {"reservation": f"res-{sku}-{qty}"}


@sagas.compensator(name="fastapi_shop.release")
def release(sku: str, qty: int, *, result: dict[str, Any], saga: StepContext) -> None:
    """Give the reservation back."""


@sagas.step(compensate=None, name="fastapi_shop.ship")
def ship(order_id: str, reservation: str, *, saga: StepContext | None = None) -> dict[str, str]:
    """Hand the parcel to the carrier."""
    return {"tracking": f"trk-{order_id}"}


@sagas.saga("fastapi-order")
def fastapi_order(ctx: SagaContext, order: dict[str, Any]) -> dict[str, Any]:
    """Reserve, wait for the payment provider's webhook (or give up), ship."""
    stock = ctx.step(reserve, order["sku"], order["qty"])
    if order.get("pay_by_webhook", True):
        payment = ctx.wait_signal("paid", timeout=order.get("payment_timeout", 600))
        if payment.get("status") != "succeeded":
            raise StepNotCommitted("payment_failed")
    shipped = ctx.step(ship, order["id"], stock["reservation"])
    return {"tracking": shipped["tracking"]}
