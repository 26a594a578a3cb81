"""The Celery app for approval e2e tests (``celery -A tests.e2e.approval_app worker``).

Same environment variables as ``tests.e2e.app`` (broker, store, prefix, queue, ledger,
control directory), plus the approval settings the test writes to CONTROL/approvals.json
before any process starts: ``{"secret": <hex>, "ttl": <seconds>}``. Every process of one test
(the test's client and each worker or beat) reads the same file, so they share the secret
without it ever reaching the store, the broker or the command line.

One saga, ``e2e-gated``: ``gated.reserve`` (undone by ``gated.release``), a manager approval
bound to the requester and the order id, then ``gated.charge``. Every body and undo appends a
JSON line to the ledger with its effect id.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from celery_sagas import Sagas
from tests.e2e.app import Config, Shop, worker_app
from tests.files import write_atomically

__all__ = ["SETTINGS_FILE", "build", "write_settings"]

SETTINGS_FILE = "approvals.json"


def write_settings(control: Path, secret: str, ttl: float) -> None:
    """Write the approval settings every process of one test reads."""
    write_atomically(control / SETTINGS_FILE, json.dumps({"secret": secret, "ttl": ttl}))


def _settings(config: Config) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((config.control / SETTINGS_FILE).read_text())
    return loaded


def _app(config: Config) -> Celery:
    return worker_app("e2e-approvals", config.broker, config.queue, config.control)


def build(config: Config) -> Shop:
    """The approval e2e app for ``config``, with ``e2e-gated`` as ``order``."""
    app = _app(config)
    options = _settings(config)
    redis = config.store.startswith("redis")
    where = {"key_prefix": config.prefix} if redis else {"table_prefix": config.prefix + "_"}
    sagas = Sagas(
        app, store=config.store, queue=config.queue, sweep_interval=config.sweep_interval,
        stale_after=config.stale_after, sweep_lease=5.0, approval_secrets=[options["secret"]],
        approval_ttl=options["ttl"], require_aof=False, **where,
    )

    def note(op: str, saga: Any) -> None:
        line = {"op": op, "pid": os.getpid(), "t": time.time(), "saga_id": saga.saga_id,
                "step": saga.step, "effect_id": saga.effect_id}
        with open(config.ledger, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    @sagas.step(name="gated.reserve", compensate="gated.release")
    def reserve(order_id: str, *, saga: Any = None) -> dict[str, str]:
        """Reserve stock for the order."""
        note("reserve", saga)
        return {"reservation": f"res-{order_id}"}

    @sagas.compensator(name="gated.release")
    def release(order_id: str, *, saga: Any = None) -> None:
        """Release the reservation."""
        note("release", saga)

    @sagas.step(name="gated.charge", compensate=None)
    def charge(order_id: str, amount: int, *, saga: Any = None) -> dict[str, int]:
        """Charge the approved amount."""
        note("charge", saga)
        return {"charged": amount}

    @sagas.saga("e2e-gated")
    def gated(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, wait for a manager, charge."""
        ctx.step(reserve, data["id"])
        decision = ctx.approval("manager", capability="orders.approve", tenant_id=data["tenant"],
                                principal_id=data["requester"], target=data["id"])
        ctx.step(charge, data["id"], data["amount"])
        return decision

    tasks = {"reserve": reserve, "release": release, "charge": charge}
    return Shop(app, sagas, gated, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
