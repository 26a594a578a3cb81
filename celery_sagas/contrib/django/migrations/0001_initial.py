"""The saga store's two tables on the database ``django://<alias>`` names (docs/django.md)."""

from __future__ import annotations

from django.db import migrations

from celery_sagas.contrib.django._schema import create_tables, drop_tables


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no type hints
    """Create the envelopes and leases tables of the SQL store."""

    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_tables, drop_tables)]
