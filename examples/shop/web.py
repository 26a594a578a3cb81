"""A small web front for the shop: start orders from a handler and read their state.

    flask --app examples.shop.web run

    POST /orders                    {"sku", "qty", "card", "total", ...} → 202 {"saga_id"}
    GET  /orders/<id>               → the saga's state and steps as JSON (404 if unknown)
    GET  /orders/<id>/approval      → the pending approval of a large order, with its token
    POST /approvals/<id>/decision   {"decision": "approved"|"denied", "decided_by", "tenant_id"}
    POST /orders/<id>/resume        {"token", "principal_id", "tenant_id"} → continue the order
    POST /webhooks/carrier          {"order_id", "event": "delivered", "delivery_id", ...}
                                    → signal the order (a repeated delivery_id counts once)

Authentication is left out: a real shop shows the token only to the customer who placed the
order and lets only managers decide.

The handler records the saga with its first step and sends that step, so it returns at once;
workers do the rest.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask, jsonify, request

from celery_sagas import SagaRecord
from celery_sagas.errors import (
    ApprovalError,
    SagaAlreadyFinal,
    SagaConflictError,
    SagaError,
    SagaNotFound,
    SagaValidationError,
    SignalLimitExceeded,
)

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


@web.get("/orders/<saga_id>/approval")
def show_approval(saga_id: str) -> Any:
    """The order's pending approval and its resume token (for the customer who placed it)."""
    try:
        pending = sagas.approvals.pending(saga_id)
    except SagaNotFound:
        return jsonify(error="no such order"), 404
    except SagaValidationError as exc:
        return jsonify(error=str(exc)), 400
    if not pending:
        return jsonify(error="no approval is pending"), 404
    approval = pending[0]
    return jsonify(approval_id=approval.approval_id, state=approval.state,
                   expires_at_ms=approval.expires_at_ms, token=approval.token)


@web.post("/approvals/<approval_id>/decision")
def decide_approval(approval_id: str) -> Any:
    """A manager approves or denies; a denial rolls the order back at once."""
    body = request.get_json(silent=True) or {}
    try:
        record = sagas.approvals.decide(
            approval_id, tenant_id=body.get("tenant_id", "shop"),
            decision=body.get("decision", ""), decided_by=body.get("decided_by", ""),
        )
    except SagaValidationError as exc:
        return jsonify(error=str(exc)), 400
    except ApprovalError as exc:
        return jsonify(error=type(exc).__name__, detail=str(exc)), 409
    return jsonify(approval_id=record.approval_id, state=str(record.state))


@web.post("/webhooks/carrier")
def carrier_webhook() -> Any:
    """The carrier reports a delivery: signal the order that waits for it (``track_delivery``).

    Carriers retry webhooks; their delivery id is the signal id, so a retry is one signal.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or body.get("event") != "delivered":
        return jsonify(error="expected {order_id, event: delivered, delivery_id}"), 400
    try:
        record = sagas.signal(str(body.get("order_id")), "delivered",
                              {"at": body.get("at"), "signed_by": body.get("signed_by")},
                              signal_id=body.get("delivery_id"))
    except SagaNotFound:
        return jsonify(error="no such order"), 404
    except SagaValidationError as exc:
        return jsonify(error=str(exc)), 400
    except (SagaAlreadyFinal, SignalLimitExceeded) as exc:
        return jsonify(error=str(exc)), 409  # the order ended, or holds too many signals
    return jsonify(saga_id=record.saga_id, state=str(record.state)), 202


@web.post("/orders/<saga_id>/resume")
def resume_order(saga_id: str) -> Any:
    """The customer comes back with the token of an approved order."""
    body = request.get_json(silent=True) or {}
    try:
        record = sagas.approvals.resume(
            saga_id, body.get("token"), tenant_id=body.get("tenant_id", "shop"),
            principal_id=body.get("principal_id", "customer"),
        )
    except (ApprovalError, SagaValidationError) as exc:
        return jsonify(error=type(exc).__name__), 409
    except SagaError as exc:
        return jsonify(error=type(exc).__name__, detail=str(exc)), 400
    return jsonify(saga_json(record))
