"""A small web front for the shop: start orders from a handler and read their state.

    flask --app examples.shop.web run

    POST /orders        {"sku": ..., "qty": ..., "card": ..., "total": ...} → 202 {"saga_id": ...}
    GET  /orders/<id>   → the saga's state and steps as JSON (404 if unknown)

The handler only records the saga and enqueues it, so it returns at once; workers do the rest.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask, jsonify, request

from celery_sagas import SagaConflictError, SagaRecord, SagaValidationError

from .app import sagas
from .orders import place_order

web = Flask(__name__)
app = web  # ``flask --app examples.shop.web`` finds ``app``


def saga_json(record: SagaRecord) -> dict[str, Any]:
    """The public view of a saga: states, ids, attempts and codes (no card data)."""
    return {
        "saga_id": record.saga_id,
        "definition": record.definition,
        "state": str(record.state),
        "error_code": record.error_code,
        "reason": record.reason,
        "steps": [
            {
                "name": step.name,
                "state": str(step.state),
                "effect_id": step.effect_id,
                "attempts": step.attempts,
                "compensation_attempts": step.compensation_attempts,
                "error_code": step.error_code,
            }
            for step in record.steps
        ],
    }


@web.post("/orders")
def create_order() -> Any:
    """Start a place-order saga; the order id (if given) doubles as the saga id."""
    order = request.get_json(silent=True)
    if not isinstance(order, dict):
        return jsonify(error="expected a JSON object"), 400
    order.setdefault("id", f"order-{uuid.uuid4().hex[:12]}")
    try:
        handle = place_order.start(order, saga_id=str(order["id"]))
    except SagaValidationError as exc:
        return jsonify(error=str(exc)), 400
    except SagaConflictError as exc:
        return jsonify(error=str(exc)), 409
    return jsonify(saga_id=handle.saga_id, state=str(handle.record.state)), 202


@web.get("/orders/<saga_id>")
def show_order(saga_id: str) -> Any:
    """The saga's state and steps."""
    try:
        record = sagas.get(saga_id)
    except SagaValidationError as exc:
        return jsonify(error=str(exc)), 400
    if record is None:
        return jsonify(error="no such order"), 404
    return jsonify(saga_json(record))
