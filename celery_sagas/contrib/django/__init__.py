"""Django integration (docs/django.md): settings, a store on a Django database, sagas started
when a transaction commits, and the operator UI under a Django URL.

    # settings.py
    INSTALLED_APPS = [..., "celery_sagas.contrib.django"]   # its migration makes the tables
    SAGAS = {"store": "django://default", "sweep_interval": 5}

    # proj/celery.py
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    sagas = configure(app)

    # a view
    with transaction.atomic():
        order = Order.objects.create(...)
        saga_id = start_on_commit(place_order, {"order_id": order.pk}, saga_id=f"order-{order.pk}")
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from ..._celery.facade import Sagas
from ._commit import start_on_commit
from ._settings import DEFAULT_STORE, options
from ._store import database_store, database_url, open_django_store

__all__ = [
    "DEFAULT_STORE",
    "configure",
    "database_store",
    "database_url",
    "open_django_store",
    "start_on_commit",
]


def configure(app: Celery, **overrides: Any) -> Sagas:
    """``Sagas`` on ``app`` with the options of ``settings.SAGAS`` (keyword arguments win).

    Options Celery already holds (``CELERY_SAGAS_*`` with ``namespace="CELERY"``) are read by
    ``Sagas`` from ``app.conf`` as usual. Without any store setting the store is
    ``django://default``: the SQL store on Django's ``default`` database.
    """
    merged = {**options(), **overrides}
    store = merged.pop("store", None) or app.conf.get("sagas_store") or DEFAULT_STORE
    return Sagas(app, store=store, **merged)
