"""The Celery app for inline-step e2e tests (``celery -A tests.e2e.inline_app worker``).

It is ``tests.e2e.app`` plus the saga ``e2e-inline`` (``@sagas.saga(inline=True)``): steps
``inl.a``, ``inl.b``, ``inl.c`` in order, then ``inl.d`` as often as the input's ``more`` says
(steps ``d0``, ``d1``...), then ``inl.sent`` (``inline=False``: always through the broker) when
the input asks for it. Every body, compensator and Celery ``task_prerun``
signal appends a JSON line to the ledger with its process id and effect (task) id. The
input's ``plan``: ``"block": {step: name}`` waits for CONTROL/<name>; ``"decline": [step]``
raises ``StepNotCommitted``.
"""

from __future__ import annotations

import os
from typing import Any

from celery.signals import task_prerun

from tests.e2e import app as base
from tests.e2e.app import Config, Shop
from tests.e2e.parallel_app import Provider

__all__ = ["build"]


def build(config: Config) -> Shop:
    """The e2e app for ``config`` with the inline saga as ``order``."""
    shop = base.build(config)
    sagas = shop.sagas
    provider = Provider(config)

    def body(key: str, plan: dict[str, Any], saga: Any) -> dict[str, str]:
        provider.note(f"{key}.start", saga)
        provider.act(key, plan, saga)
        provider.note(f"{key}.done", saga)
        return {key: saga.effect_id}

    @sagas.step(name="inl.a", compensate="inl.undo")
    def a(plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """The first step (sent by start)."""
        return body("a", plan, saga)

    @sagas.step(name="inl.b", compensate="inl.undo")
    def b(plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """The second step (inline after a)."""
        return body("b", plan, saga)

    @sagas.step(name="inl.c", compensate="inl.undo")
    def c(plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """The third step (inline after b)."""
        return body("c", plan, saga)

    @sagas.step(name="inl.d", compensate="inl.undo")
    def d(plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """The steps of a longer chain (``more``)."""
        return body("d", plan, saga)

    @sagas.step(name="inl.sent", compensate=None, inline=False)
    def sent(plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """A step that opted out: always through the broker."""
        return body("sent", plan, saga)

    @sagas.compensator(name="inl.undo")
    def undo(plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Undo one step."""
        provider.note("undo", saga)

    @sagas.saga("e2e-inline", inline=True)
    def inline(ctx: Any, data: dict[str, Any]) -> None:
        """a, b, c, d0..dN (and sent) in order."""
        plan = data.get("plan", {})
        ctx.step(a, plan)
        ctx.step(b, plan)
        ctx.step(c, plan)
        for n in range(data.get("more", 0)):
            ctx.step(d, plan, step_name=f"d{n}")
        if data.get("sent"):
            ctx.step(sent, plan)

    def prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
        if task is not None and task.name.startswith("inl."):
            provider.note("prerun", None, task_id=task_id, task=task.name)

    task_prerun.connect(prerun, weak=False)
    tasks = {"a": a, "b": b, "c": c, "d": d, "sent": sent, "undo": undo}
    return Shop(shop.app, sagas, inline, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
