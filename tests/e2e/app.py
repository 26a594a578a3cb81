"""The Celery app real e2e workers run (``celery -A tests.e2e.app worker``).

Configured from the environment by the test that starts the worker:
E2E_BROKER, E2E_STORE, E2E_PREFIX (store key/table prefix), E2E_QUEUE (a queue per test),
E2E_LEDGER (a file the fake provider appends one JSON line to per effect), E2E_CONTROL
(a directory where the test drops files that blocked steps wait for) and E2E_ENCRYPTION_KEYS
(comma-separated Fernet keys, newest first, set as ``sagas_encryption_keys``; empty: off).

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

from celery_sagas import Sagas, SignalTimeout, StepNotCommitted


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
    encryption_keys: tuple[str, ...] = ()
    code_version: int = 1  # which version of the e2e-patched saga's code this process runs

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
            encryption_keys=tuple(k for k in env.get("E2E_ENCRYPTION_KEYS", "").split(",") if k),
            code_version=int(env.get("E2E_CODE_VERSION", "1")),
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
            "E2E_ENCRYPTION_KEYS": ",".join(self.encryption_keys),
            "E2E_CODE_VERSION": str(self.code_version),
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

    # In app.conf (not a Sagas keyword) so `celery inspect conf` and `celery report` see them.
    app.conf.sagas_encryption_keys = list(config.encryption_keys)
    # The test servers run without AOF; durability has its own tests (tests/stores/test_durability.py).
    store_options: dict[str, Any] = {"require_aof": False}
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
        **{**store_options, **options},
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

    @sagas.saga("e2e-sleep")
    def sleeper(ctx: Any, data: dict[str, Any]) -> None:
        """Reserve, sleep ``seconds`` (a durable timer), charge."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        ctx.sleep(data["seconds"])
        ctx.step(charge, data["amount"], plan)

    @sagas.saga("e2e-signal")
    def waiter(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, wait for ``waits`` signals "go" (a timeout ships instead), charge their sum."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        got = []
        for _ in range(data.get("waits", 1)):
            try:
                got.append(ctx.wait_signal("go", timeout=data.get("timeout")))
            except SignalTimeout:
                return ctx.step(ship, data["id"], plan)
        ctx.step(charge, sum(g["amount"] for g in got), plan)
        return got

    @sagas.saga("e2e-patched")
    def patched(ctx: Any, data: dict[str, Any]) -> None:
        """Version 1: reserve, wait for "go", ship. Version 2 charges before the wait."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        if config.code_version >= 2 and ctx.patched("charge-before-go"):
            ctx.step(charge, data["amount"], plan)
        ctx.wait_signal("go")
        ctx.step(ship, data["id"], plan)

    @sagas.saga("e2e-payment")
    def payment(ctx: Any, data: dict[str, Any]) -> Any:
        """A child saga: charge (the plan may decline it)."""
        return ctx.step(charge, data["amount"], data.get("plan", {}))

    @sagas.saga("e2e-trip")
    def trip(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, pay in a child saga, ship."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        paid = ctx.child(payment, {"amount": data["amount"], "plan": data.get("child_plan", {})})
        ctx.step(ship, data["id"], plan)
        return paid

    @sagas.saga("e2e-fan")
    def fan(ctx: Any, data: dict[str, Any]) -> Any:
        """``n`` child payments at once."""
        calls = [ctx.call_child(payment, {"amount": i}) for i in range(data["n"])]
        return [paid["charged"] for paid in ctx.parallel(*calls)]

    @sagas.saga("e2e-recurse")
    def recurse(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, then start itself as its child ``left`` more times (the last one waits for
        "go"): past sagas_child_depth_limit the deepest child step fails."""
        ctx.step(reserve, data["sku"], {})
        if data["left"] == 0:
            return ctx.wait_signal("go")
        return ctx.child("e2e-recurse", {**data, "left": data["left"] - 1})

    tasks = {"reserve": reserve, "release": release, "charge": charge,
             "charge_idempotent": charge_idempotent, "refund": refund, "ship": ship}
    return Shop(app, sagas, order, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
