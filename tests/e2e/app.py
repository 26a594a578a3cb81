"""The Celery app real e2e workers run (``celery -A tests.e2e.app worker``).

Configured from the environment by the test that starts the worker:
E2E_BROKER, E2E_STORE, E2E_PREFIX (store key/table prefix), E2E_QUEUE (a queue per test),
E2E_LEDGER (a file the fake provider appends one JSON line to per effect) and E2E_CONTROL
(a directory where the test drops files that blocked steps wait for).

The fake provider records every body run by its idempotency key (the effect id), so tests
can count how often each side effect really happened.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from celery_sagas import Sagas, StepNotCommitted


@dataclass(frozen=True)
class Config:
    """Where one test's worker, store, queue and ledger live."""

    broker: str
    store: str
    prefix: str
    queue: str
    ledger: Path
    control: Path
    sweep_interval: float = 1.0
    stale_after: float = 2.0

    @classmethod
    def from_env(cls) -> Config:
        """The configuration a worker process was started with."""
        env = os.environ
        broker = env.get("CELERY_SAGAS_TEST_BROKER", "redis://127.0.0.1:6379/14")
        store = env.get("CELERY_SAGAS_TEST_REDIS", "redis://127.0.0.1:6379/15")
        return cls(
            broker=env.get("E2E_BROKER", broker),
            store=env.get("E2E_STORE", store),
            prefix=env.get("E2E_PREFIX", "e2e"),
            queue=env.get("E2E_QUEUE", "e2e"),
            ledger=Path(env.get("E2E_LEDGER", "/tmp/celery-sagas-e2e-ledger.jsonl")),
            control=Path(env.get("E2E_CONTROL", "/tmp/celery-sagas-e2e-control")),
            sweep_interval=float(env.get("E2E_SWEEP_INTERVAL", "1")),
            stale_after=float(env.get("E2E_STALE_AFTER", "2")),
        )

    def environ(self) -> dict[str, str]:
        """The environment that makes a worker process use this configuration."""
        return {
            "E2E_BROKER": self.broker,
            "E2E_STORE": self.store,
            "E2E_PREFIX": self.prefix,
            "E2E_QUEUE": self.queue,
            "E2E_LEDGER": str(self.ledger),
            "E2E_CONTROL": str(self.control),
            "E2E_SWEEP_INTERVAL": str(self.sweep_interval),
            "E2E_STALE_AFTER": str(self.stale_after),
        }


@dataclass
class Shop:
    """One built app: the Celery app, its Sagas, and the saga definition."""

    app: Celery
    sagas: Sagas
    order: Any
    tasks: dict[str, Any]

def worker_app(name: str, broker: str, queue: str, beat_dir: Path, **transport: Any) -> Celery:
    """A Celery app configured as the docs advise for sagas, on its own queue."""
    app = Celery(name, broker=broker)
    app.conf.update(
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={**transport, "confirm_publish": True},
        worker_hijack_root_logger=False,
        beat_schedule_filename=str(beat_dir / "beat-schedule"),
    )
    return app


def build(config: Config, **options: Any) -> Shop:
    """Build the e2e app for ``config`` (tests build their own; workers use the env);
    ``options`` are more ``Sagas`` settings."""
    app = worker_app("e2e", config.broker, config.queue, config.control, visibility_timeout=3600)

    store_options: dict[str, Any] = {}
    if config.store.startswith(("redis", "rediss")):
        store_options["key_prefix"] = config.prefix
    else:
        store_options["table_prefix"] = config.prefix + "_"

    sagas = Sagas(
        app,
        store=config.store,
        queue=config.queue,
        sweep_interval=config.sweep_interval,
        stale_after=config.stale_after,
        ambiguity_grace=1.0,
        default_time_limit=30.0,
        sweep_lease=5.0,
        **store_options,
        **options,
    )


    def record(op: str, saga: Any, **extra: Any) -> None:
        """Append one line to the ledger (O_APPEND keeps lines whole across processes)."""
        line = {"op": op, "pid": os.getpid(), "t": time.time(), **extra}
        if saga is not None:
            line.update(saga_id=saga.saga_id, step=saga.step, effect_id=saga.effect_id,
                        attempt=saga.attempt)
        with open(config.ledger, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")


    def wait_for(name: str, timeout: float = 60.0) -> None:
        """Block the body until the test drops CONTROL/<name> (or time out)."""
        deadline = time.monotonic() + timeout
        while not (config.control / name).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(name)
            time.sleep(0.02)


    def behave(op: str, plan: dict[str, Any], saga: Any) -> None:
        """Act as the plan says for this op: block, fail known, fail unknown."""
        record(f"{op}.start", saga)
        if plan.get("block") == op:
            wait_for(plan["release"])
        if plan.get("decline") == op:
            raise StepNotCommitted("declined")
        if plan.get("crash") == op:
            raise RuntimeError("provider timed out after the request left")
        flaky = plan.get("flaky", {}).get(op, 0)
        if saga is not None and saga.attempt <= flaky:
            raise ConnectionError("transient")


    @sagas.step(compensate="e2e.release")
    def reserve(sku: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Reserve stock."""
        behave("reserve", plan, saga)
        record("reserve.done", saga)
        return {"reservation": f"res-{sku}"}


    @sagas.compensator(name="e2e.release")
    def release(sku: str, plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Release the reservation."""
        record("release", saga, reservation=result["reservation"])
        failures = plan.get("release_failures", 0)
        if saga is not None and saga.attempt <= failures:
            raise ConnectionError("inventory service down")


    @sagas.step(compensate="e2e.refund")
    def charge(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, int]:
        """Charge the card."""
        behave("charge", plan, saga)
        record("charge.done", saga)
        return {"charged": amount}


    @sagas.step(compensate="e2e.refund", idempotent=True, retries=3, name="e2e.charge_idempotent")
    def charge_idempotent(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, int]:
        """Charge the card with an idempotency key the provider honours."""
        behave("charge", plan, saga)
        record("charge.done", saga)
        return {"charged": amount}


    @sagas.compensator(name="e2e.refund")
    def refund(amount: int, plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Refund the charge."""
        record("refund", saga)


    @sagas.step(compensate=None)
    def ship(order_id: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Ship the order (nothing to undo once shipped)."""
        behave("ship", plan, saga)
        record("ship.done", saga)
        return {"tracking": f"trk-{order_id}"}


    @sagas.saga("e2e-order")
    def order(ctx: Any, data: dict[str, Any]) -> None:
        """Reserve, charge, ship; the plan in the input scripts faults."""
        plan = data.get("plan", {})
        if plan.get("refuse_in_run"):
            raise RuntimeError("run refused before its first step")
        ctx.step(reserve, data["sku"], plan)
        charge_task = charge_idempotent if plan.get("idempotent") else charge
        ctx.step(charge_task, data["amount"], plan)
        ctx.step(ship, data["id"], plan)

    tasks = {"reserve": reserve, "release": release, "charge": charge,
             "charge_idempotent": charge_idempotent, "refund": refund, "ship": ship}
    return Shop(app, sagas, order, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
