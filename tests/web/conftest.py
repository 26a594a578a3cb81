"""Web UI fixtures: the engine tests' shop on a MemoryStore, served by Flask's test client.

Two users: ``olive`` (operator) and ``rita`` (readonly). Requests carry HTTP basic credentials
through ``Client.get``/``post``; ``csrf(client, user)`` reads the token an operator's forms carry.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from celery_sagas import MemoryStore, Sagas, SagaState
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from celery_sagas.web import Principal, WebUser, create_app
from celery_sagas.web._auth import SESSION_COOKIE, CsrfTokens
from tests.engine.conftest import Script, Shop, register_shop

SECRET = b"web-test-approval-secret-of-32-bytes!!"
CSRF_SECRET = b"web-test-csrf-secret-of-at-least-32-bytes"
USERS = (WebUser("olive", "olive-pw", "operator"), WebUser("rita", "rita-pw", "readonly"))
PASSWORDS = {user.name: user.password for user in USERS}
ORIGIN = "http://localhost"  # the Flask test client's own origin


def basic(user: str, password: str | None = None) -> dict[str, str]:
    """The Authorization header of ``user``."""
    raw = f"{user}:{PASSWORDS[user] if password is None else password}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


@dataclass
class Web:
    """The shop, its Flask app and a client."""

    shop: Shop
    app: Flask
    client: FlaskClient

    def get(self, path: str, user: str | None = "olive", **kwargs: Any) -> TestResponse:
        """GET as ``user`` (None: without credentials)."""
        headers = basic(user) if user else {}
        return self.client.get(path, headers=headers, **kwargs)

    def post(self, path: str, data: dict[str, str], user: str | None = "olive",
             csrf: bool = True, origin: str | None = ORIGIN, confirmed: bool = True) -> TestResponse:
        """POST a form as ``user`` from a page of the app (``Origin``), with the CSRF token of
        the client's session unless ``csrf`` is False, as confirmed (the confirmation page's
        second POST) unless ``confirmed`` is False."""
        form = dict(data)
        if confirmed:
            form.setdefault("confirmed", "yes")
        if csrf and user:
            form.setdefault("csrf_token", self.csrf(user))
        headers = basic(user) if user else {}
        if origin is not None:
            headers["Origin"] = origin
        return self.client.post(path, data=form, headers=headers)

    def csrf(self, user: str = "olive") -> str:
        """The CSRF token the forms of a page carry (the client keeps the session cookie)."""
        text = self.get("/attention", user).get_data(as_text=True)
        found = re.search(r'name="csrf_token" value="([^"]+)"', text)
        if found is not None:
            return found.group(1)
        # No form on that page (or a read-only user's): the token its forms would carry.
        cookie = self.client.get_cookie(SESSION_COOKIE)
        role = {u.name: u.role for u in USERS}[user]
        return CsrfTokens(CSRF_SECRET).token_for(Principal(user, role),
                                                 cookie.value if cookie else "0" * 32,
                                                 int(time.time()))

    @property
    def sagas(self) -> Sagas:
        """The facade behind the app."""
        return self.shop.sagas


@pytest.fixture
def shop() -> Iterator[Shop]:
    """The engine tests' shop plus a gated definition, on a fresh app."""
    yield new_shop()


def new_shop() -> Shop:
    """The engine tests' shop plus a gated definition, on a fresh app and MemoryStore."""
    app = Celery(f"web-{uuid.uuid4().hex[:8]}", set_as_current=False)
    clock = FrozenClock()
    facade = Sagas(app, store=MemoryStore(), allow_non_durable=True, clock=clock,
                   approval_secrets=[SECRET])
    driver = SagaDriver(facade)
    script = Script()
    tasks, definitions = register_shop(facade, script)

    @facade.saga("gated-order")
    def gated_order(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        ctx.approval("manager-ok", capability="orders.approve", tenant_id="t1", principal_id="p1")
        return ctx.step(tasks["charge"], order["card"], order["total"])

    definitions["gated-order"] = gated_order
    return Shop(facade, driver, clock, script, tasks, definitions)


@pytest.fixture
def web(shop: Shop) -> Web:
    """The UI over the shop, with an operator and a read-only user."""
    return new_web(shop)


def new_web(shop: Shop) -> Web:
    """The UI over ``shop``, with an operator and a read-only user."""
    app = create_app(shop.sagas, users=USERS, secret=CSRF_SECRET)
    app.config["TESTING"] = True
    return Web(shop, app, app.test_client())


def in_review(shop: Shop, saga_id: str = "o-1") -> str:
    """An order in manual review (charge's connection dropped); returns charge's effect id."""
    shop.script.then("charge", ConnectionError("reset after the request left"))
    shop.start_order(saga_id, id=saga_id)
    shop.driver.run_until_idle()
    assert shop.record(saga_id).state == SagaState.MANUAL_REVIEW
    return shop.step("shop.charge", saga_id).effect_id


def gated(shop: Shop, saga_id: str = "g-1") -> None:
    """A gated order waiting for its approval."""
    order = {"id": saga_id, "sku": "sku-1", "qty": 1, "card": "card-1", "total": 500}
    shop.definitions["gated-order"].start(order, saga_id=saga_id)
    shop.driver.run_until_idle()
