"""The shop's Celery app and Sagas, configured from the environment.

    SHOP_BROKER   broker URL   (default redis://127.0.0.1:6379/0)
    SHOP_STORE    store URL    (default redis://127.0.0.1:6379/1)

Run a worker and beat with ``celery -A examples.shop.app worker -B -l INFO``.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_sagas import Sagas

app = Celery("shop", broker=os.environ.get("SHOP_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_serializer="json",
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 3600, "confirm_publish": True},
    broker_connection_retry_on_startup=True,
)
sagas = Sagas(
    app,
    store=os.environ.get("SHOP_STORE", "redis://127.0.0.1:6379/1"),
    sweep_interval=float(os.environ.get("SHOP_SWEEP_INTERVAL", "5")),
    allow_non_durable=True,
)

# Register the tasks and the saga with this app.
from . import orders as _orders  # noqa: E402,F401
from . import tasks as _tasks  # noqa: E402,F401
