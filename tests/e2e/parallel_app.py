"""The Celery app for fan-out e2e tests (``celery -A tests.e2e.parallel_app worker``).

It is ``tests.e2e.app`` (same environment variables, broker, store and worker settings) plus
one saga, ``e2e-fan-out``: ``fan.prepare`` (an earlier step), ``width`` parallel branches of
``fan.reserve`` (one per slot), then ``fan.finish`` with every branch's slot in call order (a
later step). The input's ``plan`` scripts faults per key (``reserve-<slot>`` or ``finish``):

- ``"block": {key: name}``: the body waits until the test drops CONTROL/<name>;
- ``"decline": [key, ...]``: the body raises ``StepNotCommitted`` (a known failure);
- ``"latency_ms": n``: every branch body takes ``n`` ms, like a provider call.

Every body and compensator appends a JSON line to the ledger with its effect id, so tests
count how often each side effect and each undo really happened.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from celery_sagas import StepNotCommitted
from tests.e2e import app as base
from tests.e2e.app import Config, Shop

__all__ = ["Config", "Provider", "build"]


@dataclass(frozen=True)
class Provider:
    """A fake provider: one ledger line per call; blocks or declines as the plan says."""

    config: Config

    def note(self, op: str, saga: Any, **extra: Any) -> None:
        """Append one line (O_APPEND keeps lines whole across processes)."""
        line = {"op": op, "pid": os.getpid(), "t": time.time(), **extra}
        if saga is not None:
            line.update(saga_id=saga.saga_id, step=saga.step, effect_id=saga.effect_id,
                        attempt=saga.attempt)
        with open(self.config.ledger, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def act(self, key: str, plan: dict[str, Any], saga: Any) -> None:
        """Wait for the key's control file, then decline, as the plan says."""
        gate = plan.get("block", {}).get(key)
        deadline = time.monotonic() + 60
        while gate is not None and not (self.config.control / gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(gate)
            time.sleep(0.02)
        if key in plan.get("decline", ()):
            raise StepNotCommitted("declined")


def build(config: Config) -> Shop:
    """The e2e app for ``config`` with the fan-out saga as ``order``."""
    shop = base.build(config)
    sagas = shop.sagas
    provider = Provider(config)

    @sagas.step(name="fan.prepare", compensate="fan.unprepare")
    def prepare(order_id: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Open the order (the step before the fan-out)."""
        provider.note("prepare.start", saga)
        provider.act("prepare", plan, saga)
        provider.note("prepare.done", saga)
        return {"order": order_id}

    @sagas.compensator(name="fan.unprepare")
    def unprepare(order_id: str, plan: dict[str, Any], *, saga: Any = None) -> None:
        """Close the order."""
        provider.note("unprepare", saga)

    @sagas.step(name="fan.reserve", compensate="fan.release")
    def reserve(slot: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, int]:
        """Reserve one slot (one parallel branch)."""
        provider.note("reserve.start", saga, slot=slot)
        time.sleep(plan.get("latency_ms", 0) / 1000)
        provider.act(f"reserve-{slot}", plan, saga)
        provider.note("reserve.done", saga, slot=slot)
        return {"slot": slot}

    @sagas.compensator(name="fan.release")
    def release(slot: int, plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Release one slot."""
        provider.note("release", saga, slot=slot, result=result)

    @sagas.step(name="fan.finish", compensate=None)
    def finish(order_id: str, slots: list[int], plan: dict[str, Any], *, saga: Any = None) -> None:
        """Confirm the order with every reserved slot (the step after the fan-in)."""
        provider.note("finish.start", saga, slots=slots)
        provider.act("finish", plan, saga)
        provider.note("finish.done", saga)

    @sagas.saga("e2e-fan-out")
    def fan_out(ctx: Any, data: dict[str, Any]) -> None:
        """Prepare, reserve ``width`` slots in parallel, finish with all of them."""
        plan = data.get("plan", {})
        ctx.step(prepare, data["id"], plan)
        slots = ctx.parallel(*(ctx.call(reserve, slot, plan) for slot in range(data["width"])))
        ctx.step(finish, data["id"], [s["slot"] for s in slots], plan)

    tasks = {"prepare": prepare, "unprepare": unprepare, "reserve": reserve,
             "release": release, "finish": finish}
    return Shop(shop.app, sagas, fan_out, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
