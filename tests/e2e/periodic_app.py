"""The Celery app for scheduled-saga e2e tests (``celery -A tests.e2e.periodic_app worker|beat``).

``tests.e2e.app`` plus one schedule, ``tick``: the ``e2e-order`` saga every
``E2E_PERIODIC_EVERY`` seconds (default 2). Every run of the ``celery_sagas.periodic`` task
appends a ``tick`` line to the ledger with the send time its message carried, so a test can
tell how many ticks were sent (by every beat) and which slots they named.

``E2E_PERIODIC_VARIANT`` (environment) builds a mistaken app: ``none`` declares no schedule (a
worker of the same service whose modules do not declare it), ``typo`` a schedule naming the
definition ``e2e-ordre``, which nobody registered.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery.signals import task_postrun

from celery_sagas import SagaSchedule
from tests.e2e.app import Config, Shop
from tests.e2e.app import build as build_shop

__all__ = ["INPUT", "SCHEDULE", "build"]

SCHEDULE = "tick"
INPUT = {"sku": "sku-nightly", "amount": 5, "id": "nightly", "plan": {}}


def build(config: Config) -> tuple[Shop, SagaSchedule]:
    """The e2e shop with the ``tick`` schedule."""
    shop = build_shop(config)
    every = float(os.environ.get("E2E_PERIODIC_EVERY", "2"))
    variant = os.environ.get("E2E_PERIODIC_VARIANT", "ok")
    if variant == "none":
        return shop, None  # type: ignore[return-value]
    definition = "e2e-ordre" if variant == "typo" else shop.order
    schedule = shop.sagas.periodic(definition, every, input=INPUT, name=SCHEDULE)

    @task_postrun.connect(weak=False)
    def note_tick(task: Any = None, **_: Any) -> None:
        if task is None or task.name != "celery_sagas.periodic":
            return
        line = {"op": "tick", "pid": os.getpid(), "t": time.time(),
                "sent_at_ms": getattr(task.request, "saga_sent_at_ms", None)}
        with open(config.ledger, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    return shop, schedule


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env())[0].app
