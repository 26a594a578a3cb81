"""The Celery app for the e2e tests of issue 29 (``celery -A tests.e2e.real_sagas_app worker``).

It is ``tests.e2e.app`` (same environment variables, broker, store and worker settings) plus
the sagas the reference ports needed:

- ``real-limited``: reserve, then ``real.call``, which the provider rate-limits as often as
  the plan's ``limited`` says (``retry_on=(RateLimited,)``, ``retries=3``).

Every body and compensator appends a JSON line to the ledger (``tests.e2e.parallel_app``'s
``Provider``), so tests count how often each side effect and each undo really happened.
"""

from __future__ import annotations

import os
from typing import Any

from tests.e2e import app as base
from tests.e2e.app import Config, Shop
from tests.e2e.parallel_app import Provider

__all__ = ["Config", "RateLimited", "build"]


class RateLimited(Exception):
    """The provider answered 429 Too Many Requests: nothing was done."""


def build(config: Config) -> Shop:
    """The e2e app for ``config`` with the issue-29 sagas (``order`` is ``real-limited``)."""
    shop = base.build(config)
    sagas = shop.sagas
    provider = Provider(config)
    reserve = shop.tasks["reserve"]

    @sagas.step(name="real.call", compensate=None, retry_on=(RateLimited,), retries=3,
                backoff=lambda _: 0.2)
    def call(user: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Call a rate-limited API (limited on the first ``plan["limited"]`` attempts)."""
        provider.note("call.start", saga)
        if saga.attempt <= plan.get("limited", 0):
            raise RateLimited("429 Too Many Requests")
        provider.note("call.done", saga)
        return {"called": user}

    @sagas.saga("real-limited")
    def limited(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, then call the rate-limited API."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        return ctx.step(call, data["user"], plan)

    tasks = {**shop.tasks, "call": call}
    return Shop(shop.app, sagas, limited, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
