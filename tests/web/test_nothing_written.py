"""A web action that is refused has written nothing: each action (resolve, resume, cancel,
approve, deny, signal) is made to fail each way it can, and a dump of the whole store before
and after must be equal (the same rule as tests/engine/test_nothing_written.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery

from celery_sagas import Sagas
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, register_shop
from tests.kept import Kept, close_all, handed_on, memory_dump
from tests.web.conftest import Web, gated, in_review, new_shop, new_web

KEY = "3ZkPZb0bCaQb5-j0pXM0N2z6XqQxFwCO4JvQn8fXq0U="
PAST_EXPIRY_MS = 16 * 60_000  # sagas_approval_ttl is 15 minutes


def dump(web: Web) -> Any:
    """Everything the UI's MemoryStore holds."""
    store: Any = web.sagas.store
    return memory_dump(store)


@dataclass
class Given:
    """The UI over the sagas of ``_given``, with their ids."""

    web: Web
    ids: dict[str, str]


@pytest.fixture(scope="module")
def kept() -> Iterator[dict[str, Kept[Given]]]:
    """The world this pytest process has built (under "given"), if any."""
    worlds: dict[str, Kept[Given]] = {}
    yield worlds
    close_all(worlds)


@pytest.fixture
def given(kept: dict[str, Kept[Given]]) -> Iterator[Given]:
    """The sagas every case needs. Building them takes most of a test's time (one saga holds
    as many signals as it may), so they are built once per pytest process and handed on while
    tests leave them as built (tests/kept.py)."""
    yield from handed_on(kept, "given", _made)


def _made() -> Kept[Given]:
    web = new_web(new_shop())
    ids = _given(web)
    return Kept(Given(web, ids), lambda: dump(web), web.shop.clock)


def _given(web: Web) -> dict[str, str]:
    """An order in review, a gated order with a pending approval, a completed order, one
    approval decided already (its saga holding as many signals as it may), one whose saga was
    cancelled, and an order sealed with a key this process does not list."""
    effect = in_review(web.shop)
    for saga_id in ("g-1", "g-2", "g-3"):
        gated(web.shop, saga_id)
    web.shop.start_order("done", id="done")
    web.shop.driver.run_until_idle()
    [pending] = web.sagas.approvals.pending("g-1")
    [decided] = web.sagas.approvals.pending("g-2")
    [closed] = web.sagas.approvals.pending("g-3")
    web.sagas.approvals.decide(decided.approval_id, tenant_id="t1", decision="approved",
                               decided_by="mgr")
    web.sagas.cancel("g-3")
    for i in range(web.sagas.settings.limits.signals):
        web.sagas.signal("g-2", "other", i)
    web.shop.driver.run_until_idle()
    sealer = Sagas(Celery(f"seal-{uuid.uuid4().hex[:6]}", set_as_current=False),
                   store=web.sagas.store, allow_non_durable=True, clock=web.shop.clock,
                   encryption_keys=[KEY])
    register_shop(sealer, Script())
    SagaDriver(sealer)
    sealer.start("place-order", ORDER, saga_id="sealed")
    return {"effect": effect, "pending": pending.approval_id, "decided": decided.approval_id,
            "closed": closed.approval_id,
            "done_effect": web.shop.step("shop.charge", "done").effect_id}


def _later(web: Web) -> None:
    """The approvals are past their expiry (the clock only moves)."""
    web.shop.clock.advance(PAST_EXPIRY_MS)


# (case, path, the form, the status); a case named "... expired" is posted past the expiry
ACTIONS: list[tuple[str, str, Callable[[dict[str, str]], dict[str, str]], int]] = [
    ("resolve: stale effect id", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.charge", "effect_id": str(uuid.uuid4()),
                "outcome": "committed", "result": "{}"}, 409),
    ("resolve: bad outcome", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.charge", "effect_id": g["effect"],
                "outcome": "maybe"}, 400),
    ("resolve: result not JSON", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.charge", "effect_id": g["effect"],
                "outcome": "committed", "result": "{nope"}, 400),
    ("resolve: no saga", "/actions/resolve",
     lambda g: {"saga_id": "missing", "step": "shop.charge", "effect_id": g["effect"],
                "outcome": "committed", "result": "{}"}, 404),
    ("resolve: bad effect id", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.charge", "effect_id": "has space",
                "outcome": "committed", "result": "{}"}, 400),
    ("resolve: unknown step", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.nope", "effect_id": g["effect"],
                "outcome": "committed", "result": "{}"}, 409),
    ("resolve: step not ambiguous", "/actions/resolve",
     lambda g: {"saga_id": "done", "step": "shop.charge", "effect_id": g["done_effect"],
                "outcome": "not-committed"}, 409),
    ("resolve: bad error code", "/actions/resolve",
     lambda g: {"saga_id": "o-1", "step": "shop.charge", "effect_id": g["effect"],
                "outcome": "not-committed", "error_code": "has space"}, 400),
    ("resolve: undecryptable", "/actions/resolve",
     lambda g: {"saga_id": "sealed", "step": "shop.charge", "effect_id": g["effect"],
                "outcome": "committed", "result": "{}"}, 409),
    ("resume: unresolved step", "/actions/resume", lambda g: {"saga_id": "o-1"}, 409),
    ("resume: undecryptable", "/actions/resume", lambda g: {"saga_id": "sealed"}, 409),
    ("cancel: undecryptable", "/actions/cancel", lambda g: {"saga_id": "sealed"}, 409),
    ("approve: expired", "/actions/approve", lambda g: {"approval_id": g["pending"]}, 409),
    ("deny: expired", "/actions/deny", lambda g: {"approval_id": g["pending"]}, 409),
    ("approve: gate closed", "/actions/approve", lambda g: {"approval_id": g["closed"]}, 409),
    ("deny: gate closed", "/actions/deny", lambda g: {"approval_id": g["closed"]}, 409),
    ("deny: no approval", "/actions/deny", lambda g: {"approval_id": "missing"}, 404),
    ("approve: bad approval id", "/actions/approve", lambda g: {"approval_id": "has space"},
     400),
    ("signal: past the limit", "/actions/signal",
     lambda g: {"saga_id": "g-2", "name": "other", "payload": "1"}, 409),
    ("signal: payload not JSON", "/actions/signal",
     lambda g: {"saga_id": "g-1", "name": "go", "payload": "{nope"}, 400),
    ("signal: payload too large", "/actions/signal",
     lambda g: {"saga_id": "g-1", "name": "go", "payload": json.dumps("x" * 300_000)}, 400),
    ("signal: bad signal id", "/actions/signal",
     lambda g: {"saga_id": "g-1", "name": "go", "payload": "1", "signal_id": "has space"}, 400),
    ("signal: undecryptable", "/actions/signal",
     lambda g: {"saga_id": "sealed", "name": "go", "payload": "1"}, 409),
    ("resume: no saga", "/actions/resume", lambda g: {"saga_id": "missing"}, 404),
    ("cancel: unresolved step", "/actions/cancel", lambda g: {"saga_id": "o-1"}, 409),
    ("cancel: no saga", "/actions/cancel", lambda g: {"saga_id": "missing"}, 404),
    ("approve: already decided", "/actions/approve", lambda g: {"approval_id": g["decided"]},
     409),
    ("deny: already decided", "/actions/deny", lambda g: {"approval_id": g["decided"]}, 409),
    ("approve: no approval", "/actions/approve", lambda g: {"approval_id": "missing"}, 404),
    ("signal: final saga", "/actions/signal",
     lambda g: {"saga_id": "done", "name": "go", "payload": "1"}, 409),
    ("signal: bad name", "/actions/signal",
     lambda g: {"saga_id": "g-1", "name": "no spaces!", "payload": "1"}, 400),
    ("signal: no saga", "/actions/signal",
     lambda g: {"saga_id": "missing", "name": "go", "payload": "1"}, 404),
]


@pytest.mark.parametrize("case, path, form, status", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_a_refused_web_action_writes_nothing(given: Given, case: str, path: str,
                                             form: Callable[[dict[str, str]], dict[str, str]],
                                             status: int) -> None:
    # given
    web = given.web
    data = form(given.ids)
    csrf = web.csrf()
    if case.endswith("expired"):
        _later(web)
    before = dump(web)

    # when
    response = web.post(path, {**data, "csrf_token": csrf})

    # then
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    assert dump(web) == before, case
