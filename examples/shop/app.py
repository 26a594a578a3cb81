"""The shop's Celery app and Sagas, configured from the environment.

    SHOP_BROKER   broker URL   (default redis://127.0.0.1:6379/0)
    SHOP_STORE    store URL    (default redis://127.0.0.1:6379/1: a Redis with an append-only
                  file, ``redis-server --appendonly yes --appendfsync everysec``; add
                  ``?require_aof=false`` for a development Redis without one)
    SHOP_APPROVAL_SECRET       secret that signs approval tokens (32+ bytes)

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
# Approval tokens are signed with this secret; every worker and web process needs the same
# one. The fallback is for local runs only: set SHOP_APPROVAL_SECRET (32+ random bytes).
APPROVAL_SECRET = os.environ.get("SHOP_APPROVAL_SECRET", "dev-only-approval-secret-change-me-0000")

sagas = Sagas(
    app,
    store=os.environ.get("SHOP_STORE", "redis://127.0.0.1:6379/1"),
    sweep_interval=float(os.environ.get("SHOP_SWEEP_INTERVAL", "5")),
    approval_secrets=[APPROVAL_SECRET],
    allow_non_durable=True,
)

# Register the tasks and the saga with this app.
from . import orders as _orders  # noqa: E402,F401
from . import tasks as _tasks  # noqa: E402,F401
