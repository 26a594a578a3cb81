"""The orders app of the shop example."""

from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """Orders, stock, reservations and payments."""

    name = "orders"
    default_auto_field = "django.db.models.BigAutoField"
