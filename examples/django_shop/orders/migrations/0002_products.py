"""A few products in stock, so a fresh database can take orders."""

from __future__ import annotations

from typing import Any

from django.db import migrations

STOCK = {"MUG": 100, "TEE": 50, "CAP": 20}


def stock_products(apps: Any, schema_editor: Any) -> None:
    """Put the products in stock."""
    product = apps.get_model("orders", "Product")
    for sku, stock in STOCK.items():
        product.objects.update_or_create(sku=sku, defaults={"stock": stock})


class Migration(migrations.Migration):
    """Seed the products."""

    dependencies = [("orders", "0001_initial")]
    operations = [migrations.RunPython(stock_products, migrations.RunPython.noop)]
