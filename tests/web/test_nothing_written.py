"""A web action that is refused has written nothing: each action (resolve, resume, cancel,
approve, deny, signal) is made to fail each way it can, and a dump of the whole store before
and after must be equal (the same rule as tests/engine/test_nothing_written.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.web.conftest import Web, gated, in_review


def dump(web: Web) -> dict[Any, Any]:
    store: Any = web.sagas.store
    return {k: (e.version, e.state, e.body, e.notes) for k, e in store._records.items()}


def _given(web: Web) -> dict[str, str]:
    """An order in review, a gated order with a pending approval, a completed order, and one
    approval decided already."""
    effect = in_review(web.shop)
    gated(web.shop)
    gated(web.shop, "g-2")
    web.shop.start_order("done", id="done")
    web.shop.driver.run_until_idle()
    [pending] = web.sagas.approvals.pending("g-1")
    [decided] = web.sagas.approvals.pending("g-2")
    web.sagas.approvals.decide(decided.approval_id, tenant_id="t1", decision="approved",
                               decided_by="mgr")
    return {"effect": effect, "pending": pending.approval_id, "decided": decided.approval_id}


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
    ("resume: unresolved step", "/actions/resume", lambda g: {"saga_id": "o-1"}, 409),
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
def test_a_refused_web_action_writes_nothing(web: Web, case: str, path: str,
                                             form: Callable[[dict[str, str]], dict[str, str]],
                                             status: int) -> None:
    # given
    given = _given(web)
    data = form(given)
    csrf = web.csrf()
    before = dump(web)

    # when
    response = web.post(path, {**data, "csrf_token": csrf})

    # then
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    assert dump(web) == before, case
