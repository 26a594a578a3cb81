"""The Celery app for the e2e tests of issue 29 (``celery -A tests.e2e.real_sagas_app worker``).

It is ``tests.e2e.app`` (same environment variables, broker, store and worker settings) plus
the sagas the reference ports needed:

- ``real-limited``: reserve, then ``real.call``, which the provider rate-limits as often as
  the plan's ``limited`` says (``retry_on=(RateLimited,)``, ``retries=3``);
- ``real-label``: reserve, buy a label (``compensate_unknown=True``: its cancel runs whatever
  the purchase's outcome), ship. The plan's ``block`` ({"label": name}) holds the label body
  until the test drops CONTROL/<name>;
- ``real-pay``: reserve, charge with provider A; when A declines (``"decline": ["pay_a"]``),
  ``run`` catches ``StepFailed`` and charges with provider B (idempotent); ship;
- ``real-trip`` (``compensation="parallel"``): book a flight, a hotel and a car, then pay
  with provider A; a declined payment cancels the three bookings at once;
- ``real-deploy``: reserve, charge, ship under ``E2E_CODE_VERSION=1``; ship before charge
  under version 2; the same behind ``ctx.patched("ship-first")`` under version 3 (the deploy
  check's three versions of one change).

Every body and compensator appends a JSON line to the ledger (``tests.e2e.parallel_app``'s
``Provider``), so tests count how often each side effect and each undo really happened.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_sagas import StepFailed
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

    @sagas.step(name="real.label", compensate="real.cancel_label", compensate_unknown=True)
    def label(order_id: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Buy a shipping label (the plan may block it, for a test to kill the worker)."""
        provider.note("label.start", saga)
        provider.act("label", plan, saga)
        provider.note("label.done", saga)
        return {"label": f"lbl-{order_id}"}

    @sagas.compensator(name="real.cancel_label")
    def cancel_label(order_id: str, plan: dict[str, Any], *, result: Any = None,
                     saga: Any = None) -> None:
        """Cancel the label by its request id, whatever came of the purchase."""
        provider.note("cancel_label", saga, outcome=saga.outcome, undoes=saga.forward_effect_id,
                      reason=str(saga.reason), result=result,
                      input=saga.input)

    @sagas.saga("real-label")
    def _shipping(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve, buy a label, then ship (the plan may decline the shipment)."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        ctx.step(label, data["id"], plan)
        return ctx.step(shop.tasks["ship"], data["id"], plan)

    @sagas.step(name="real.pay_a", compensate="e2e.refund")
    def pay_a(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge with provider A (the plan may decline: a known failure)."""
        provider.note("pay_a.start", saga)
        provider.act("pay_a", plan, saga)
        return {"provider": "a", "charged": amount}

    @sagas.step(name="real.pay_b", compensate="e2e.refund", idempotent=True)
    def pay_b(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge with provider B, which honours idempotency keys (the plan may block it)."""
        provider.note("pay_b.start", saga)
        provider.act("pay_b", plan, saga)
        provider.note("pay_b.done", saga)
        return {"provider": "b", "charged": amount}

    @sagas.saga("real-pay")
    def _pay(ctx: Any, data: dict[str, Any]) -> Any:
        """Reserve; charge with provider A, or with B once A declined; ship."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        try:
            paid = ctx.step(pay_a, data["amount"], plan)
        except StepFailed:
            paid = ctx.step(pay_b, data["amount"], plan)
        ctx.step(shop.tasks["ship"], data["id"], plan)
        return paid

    @sagas.step(name="real.book", compensate="real.unbook")
    def book(kind: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, str]:
        """Book a flight, a hotel or a car."""
        provider.note("book.done", saga, kind=kind)
        return {"booking": kind}

    @sagas.compensator(name="real.unbook")
    def unbook(kind: str, plan: dict[str, Any], *, saga: Any = None) -> None:
        """Cancel a booking (takes ``plan["unbook_ms"]``; fails its first attempts as the
        plan's ``unbook_failures`` says)."""
        provider.note("unbook.start", saga, kind=kind)
        time.sleep(plan.get("unbook_ms", 0) / 1000)
        if saga.attempt <= plan.get("unbook_failures", {}).get(kind, 0):
            provider.note("unbook.fail", saga, kind=kind)
            raise ConnectionError(f"{kind} service down")
        provider.note("unbook.done", saga, kind=kind)

    @sagas.saga("real-trip", compensation="parallel", backoff=lambda _: 0.2)
    def _trip(ctx: Any, data: dict[str, Any]) -> Any:
        """Book a flight, a hotel and a car, then pay (the plan may decline the payment)."""
        plan = data.get("plan", {})
        for kind in ("flight", "hotel", "car"):
            ctx.step(book, kind, plan, step_name=f"book-{kind}")
        return ctx.step(pay_a, data["amount"], plan)

    charge, ship = shop.tasks["charge"], shop.tasks["ship"]

    @sagas.saga("real-deploy")
    def _deploy(ctx: Any, data: dict[str, Any]) -> None:
        """Code version 1: reserve, charge, ship. Version 2 ships before it charges (a
        reordering); version 3 does so only behind ``ctx.patched("ship-first")``."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        version = config.code_version
        if version == 2 or (version >= 3 and ctx.patched("ship-first")):
            ctx.step(ship, data["id"], plan)
            ctx.step(charge, data["amount"], plan)
        else:
            ctx.step(charge, data["amount"], plan)
            ctx.step(ship, data["id"], plan)

    tasks = {**shop.tasks, "call": call, "label": label, "cancel_label": cancel_label,
             "pay_a": pay_a, "pay_b": pay_b, "book": book, "unbook": unbook}
    return Shop(shop.app, sagas, limited, tasks)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env()).app
