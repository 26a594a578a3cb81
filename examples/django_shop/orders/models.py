"""The shop's tables. Reservations and payments are keyed by the effect id of the step that
made them: a step that runs again (a retry, a redelivery) finds its own row instead of
reserving or charging twice."""

from __future__ import annotations

from typing import Any

from django.db import models


class Product(models.Model):
    """A product and how many are in stock."""

    sku = models.CharField(max_length=32, primary_key=True)
    stock = models.PositiveIntegerField()


class Order(models.Model):
    """An order as the customer placed it; its saga does the rest."""

    order_id = models.CharField(max_length=64, unique=True)
    sku = models.CharField(max_length=32)
    qty = models.PositiveIntegerField()
    total = models.PositiveIntegerField()  # cents
    card = models.CharField(max_length=64)  # a payment provider's card token, never a number
    status = models.CharField(max_length=16, default="pending")
    created_at = models.DateTimeField(auto_now_add=True)

    @property
    def saga_id(self) -> str:
        """The id of this order's saga: one saga per order, however often it is asked for."""
        return f"order-{self.order_id}"

    def saga_input(self) -> dict[str, Any]:
        """What the saga needs, taken from the stored order (the same for every request)."""
        return {"order_id": self.order_id, "sku": self.sku, "qty": self.qty, "total": self.total,
                "card": self.card}


class Reservation(models.Model):
    """Stock set aside for an order by the step whose effect id this is."""

    effect_id = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=64)
    sku = models.CharField(max_length=32)
    qty = models.PositiveIntegerField()
    released = models.BooleanField(default=False)


class Payment(models.Model):
    """A charge made by the step whose effect id this is (the provider's idempotency key)."""

    effect_id = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=64)
    amount = models.PositiveIntegerField()
    refunded = models.BooleanField(default=False)
