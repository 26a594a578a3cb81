"""The FastAPI shop: saga calls awaited in ``async def`` handlers (docs/async.md).

    uvicorn examples.fastapi_shop.web:app

    POST /orders                 {"sku", "qty", ...}    → 202 {"saga_id", "state"}
    GET  /orders/{id}            → the saga's state (404 if unknown)
    GET  /orders/{id}/wait       ?timeout=seconds → the state once settled (408 past timeout)
    POST /webhooks/payment       {"order_id", "delivery_id", "status"} → signal "paid"
                                 (a repeated delivery_id counts once)

Every call goes through ``sagas.aio``: the event loop serves other requests while a store
round trip or a publish is in flight. Authentication is left out.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from celery_sagas import SagaRecord
from celery_sagas.errors import SagaConflictError, SagaNotFound, SagaValidationError

from .app import sagas

aio = sagas.aio


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    """Close the async client's connections when the server stops."""
    yield
    await aio.aclose()


app = FastAPI(title="fastapi shop", lifespan=lifespan)


def saga_json(record: SagaRecord) -> dict[str, Any]:
    """The public view of a saga: states, codes and the result (no payment data)."""
    return {"saga_id": record.saga_id, "state": str(record.state), "error_code": record.error_code,
            "result": record.result, "steps": [[s.name, str(s.state)] for s in record.steps]}


@app.post("/orders", status_code=202)
async def create_order(request: Request) -> Any:
    """Start a saga; the order id (if given) doubles as the saga id, so a retry is harmless."""
    order = await request.json()
    if not isinstance(order, dict):
        raise HTTPException(400, "expected a JSON object")
    order.setdefault("id", f"order-{uuid.uuid4().hex[:12]}")
    try:
        handle = await aio.start("fastapi-order", order, saga_id=str(order["id"]))
    except SagaValidationError as exc:
        raise HTTPException(400, str(exc)) from None
    except SagaConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"saga_id": handle.saga_id, "state": str(handle.record.state)}


@app.get("/orders/{order_id}")
async def show_order(order_id: str) -> Any:
    """The saga's state and steps."""
    record = await aio.get(order_id)
    if record is None:
        raise HTTPException(404, "no such order")
    return saga_json(record)


@app.get("/orders/{order_id}/wait")
async def wait_order(order_id: str, timeout: float = 30.0) -> Any:
    """The saga once completed, compensated or in manual review."""
    try:
        return saga_json(await aio.wait(order_id, timeout=min(timeout, 60.0)))
    except SagaNotFound:
        raise HTTPException(404, "no such order") from None
    except TimeoutError:
        record = await aio.get(order_id)
        body = saga_json(record) if record is not None else {}
        return JSONResponse(body, status_code=408)


@app.post("/webhooks/payment")
async def payment_webhook(request: Request) -> Any:
    """The payment provider's callback: signal the order (idempotent by delivery id)."""
    event = await request.json()
    if not isinstance(event, dict) or not isinstance(event.get("order_id"), str):
        raise HTTPException(400, "expected {order_id, delivery_id, status}")
    try:
        record = await aio.signal(event["order_id"], "paid", {"status": event.get("status")},
                                  signal_id=str(event.get("delivery_id") or uuid.uuid4()))
    except SagaNotFound:
        raise HTTPException(404, "no such order") from None
    except SagaValidationError as exc:
        raise HTTPException(400, str(exc)) from None
    return {"saga_id": record.saga_id, "state": str(record.state)}
