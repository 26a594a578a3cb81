"""The Celery app for e2e tests of user mistakes (``celery -A tests.e2e.misuse_app worker``).

It is ``tests.e2e.app`` (same environment variables) plus one saga, ``misuse-order``:
``misuse.reserve`` (undone by ``misuse.release``), then ``misuse.charge`` (nothing to undo).
The input's ``plan`` says what goes wrong: ``"charge": "crash" | "decline" | "decline_upper"
| "http" | "bad_result"`` (``decline_upper`` raises ``StepNotCommitted("INSUFFICIENT_CREDIT")``,
``http`` an ``HTTPError`` declared in ``not_committed_on``),
``"release": "crash"`` (every compensator call raises), ``"run": "crash"`` (``run`` raises
after the first step). ``MISUSE_VARIANT`` (environment) builds a mistaken app:

- ``typo``: a step names a compensator nobody registered (``typo.name``);
- ``other``: only ``tests.e2e.app``: a worker of another service on the same queue, which
  has none of the misuse tasks;
- ``config-later``: ``app.config_from_object(...)`` after ``Sagas(app)``;
- ``pickle-later``: the same, and the new configuration accepts pickle.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from celery_sagas import StepNotCommitted
from tests.e2e import app as base
from tests.e2e.app import Config, Shop

__all__ = ["COMPENSATOR_BOOM", "RUN_BOOM", "STEP_BOOM", "build"]

STEP_BOOM = "charge exploded step-boom-41"
COMPENSATOR_BOOM = "release exploded comp-boom-42"
RUN_BOOM = "run exploded run-boom-43"


class HTTPError(Exception):
    """A provider's refusal, declared as "not committed" by ``misuse.charge``."""


def _plan(data: Any) -> dict[str, Any]:
    return data.get("plan", {}) if isinstance(data, dict) else {}


def build(config: Config, variant: str = "ok") -> Shop:
    """The misuse app for ``config``, mistaken as ``variant`` says; ``order`` is misuse-order."""
    shop = base.build(config)
    if variant == "other":
        return shop
    sagas = shop.sagas

    @sagas.step(name="misuse.reserve", compensate="misuse.release")
    def reserve(sku: str, note: str, plan: dict[str, Any]) -> dict[str, str]:
        return {"reservation": f"res-{sku}", "note": note}

    @sagas.compensator(name="misuse.release")
    def release(sku: str, note: str, plan: dict[str, Any], *, result: Any = None) -> None:
        if plan.get("release") == "crash":
            raise ConnectionError(COMPENSATOR_BOOM)

    @sagas.step(name="misuse.charge", compensate=None, not_committed_on=(HTTPError,))
    def charge(amount: int, note: str, plan: dict[str, Any]) -> Any:
        what = plan.get("charge")
        if what == "crash":
            raise RuntimeError(STEP_BOOM)
        if what == "decline":
            raise StepNotCommitted("declined")
        if what == "decline_upper":
            raise StepNotCommitted("INSUFFICIENT_CREDIT")
        if what == "http":
            raise HTTPError("402 Payment Required")
        if what == "bad_result":
            return {"note": note + "\ud800"}
        return {"charged": amount}

    if variant == "typo":
        @sagas.step(name="misuse.typo", compensate="typo.name")
        def typo(x: int) -> int:
            return x

    @sagas.saga("misuse-order")
    def order(ctx: Any, data: dict[str, Any]) -> Any:
        plan = _plan(data)
        ctx.step(reserve, data["sku"], data["note"], plan)
        if plan.get("run") == "crash":
            raise ValueError(RUN_BOOM)
        return ctx.step(charge, data["amount"], data["note"], plan)

    if variant in ("config-later", "pickle-later"):
        _configure_later(shop, config, pickle=variant == "pickle-later")
    shop.tasks.update(misuse_reserve=reserve, misuse_charge=charge)
    return Shop(shop.app, sagas, order, shop.tasks)


def _configure_later(shop: Shop, config: Config, *, pickle: bool) -> None:
    """What a user does after ``Sagas(app)``: load the app's settings from an object."""
    settings = SimpleNamespace(
        broker_url=config.broker,
        task_default_queue=config.queue,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600, "confirm_publish": True},
        worker_hijack_root_logger=False,
        accept_content=["json", "pickle"] if pickle else ["json"],
    )
    shop.app.config_from_object(settings)


if os.environ.get("E2E_BROKER"):
    app = build(Config.from_env(), os.environ.get("MISUSE_VARIANT", "ok")).app
