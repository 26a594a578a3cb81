"""The shop's JSON API: place an order (its saga starts when the order is committed) and read
an order with its saga."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from celery_sagas.contrib.django import start_on_commit

from .models import Order
from .tasks import place_order, sagas

_FIELDS = {"order_id": str, "sku": str, "qty": int, "total": int, "card": str}


@csrf_exempt  # a JSON API for other services; a browser form would keep Django's CSRF check
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """Record the order and start its saga once that is committed; 202 with the saga id.

    Posting the same order again (a client retrying) finds the order and asks for the same saga
    again, which is harmless: one order, one saga.
    """
    order = _parsed(request.body)
    if order is None:
        return JsonResponse({"error": "expected " + ", ".join(_FIELDS)}, status=400)
    with transaction.atomic():
        stored, created = Order.objects.get_or_create(order_id=order["order_id"], defaults=order)
        saga_id = start_on_commit(place_order, stored.saga_input(), saga_id=stored.saga_id)
    return JsonResponse({"order_id": stored.order_id, "saga_id": saga_id, "created": created},
                        status=202)


@require_GET
def show_order(request: HttpRequest, order_id: str) -> JsonResponse:
    """The order, its saga's state and each step's state."""
    order = get_object_or_404(Order, order_id=order_id)
    saga = sagas.get(order.saga_id)
    return JsonResponse({
        "order_id": order.order_id, "status": order.status,
        "saga": None if saga is None else {
            "id": saga.saga_id, "state": str(saga.state), "error_code": saga.error_code,
            "steps": [{"name": s.name, "state": str(s.state)} for s in saga.steps],
        },
    })


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        return None
    if not all(type(data[name]) is kind for name, kind in _FIELDS.items()):
        return None
    if not 0 < len(data["order_id"]) <= 58 or data["qty"] < 1 or data["total"] < 1:
        return None
    return data
