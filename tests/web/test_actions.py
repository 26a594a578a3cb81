"""Actions go through the facade with its refusals, and are logged with who did them."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from markupsafe import escape

from celery_sagas import SagaState
from celery_sagas.web import OperatorAction, create_app
from tests.web.conftest import CSRF_SECRET, USERS, Web, gated, in_review


def resolve_form(effect: str, **changes: str) -> dict[str, str]:
    return {"saga_id": "o-1", "step": "shop.charge", "effect_id": effect, "outcome": "committed",
            "result": json.dumps({"charge": "ch_secret_123"}), **changes}


def test_resolve_then_resume_through_the_forms_completes_the_saga(
        web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # given
    effect = in_review(web.shop)

    # when
    with caplog.at_level(logging.INFO, logger="celery_sagas.web"):
        resolved = web.post("/actions/resolve", resolve_form(effect))
        resumed = web.post("/actions/resume", {"saga_id": "o-1"})
        web.shop.driver.run_until_idle()

    # then
    assert resolved.status_code == 303
    assert resolved.headers["Location"] == "/saga?id=o-1&done=resolve"
    assert resumed.status_code == 303
    record = web.shop.record("o-1")
    assert record.state == SagaState.COMPLETED
    assert record.step("shop.charge").result == {"charge": "ch_secret_123"}  # type: ignore[union-attr]
    assert "Resolved." in web.get("/saga?id=o-1&done=resolve").get_data(as_text=True)
    done = [r for r in caplog.records if getattr(r, "web_outcome", None) == "done"]
    assert [(r.web_action, r.web_principal, r.saga_id) for r in done] == [  # type: ignore[attr-defined]
        ("resolve", "olive", "o-1"), ("resume", "olive", "o-1")]
    assert "ch_secret_123" not in caplog.text and "olive-pw" not in caplog.text


def test_not_committed_records_the_error_code_and_compensates(web: Web) -> None:
    # given
    effect = in_review(web.shop)

    # when
    web.post("/actions/resolve", resolve_form(effect, outcome="not-committed", error_code="lost"))
    web.post("/actions/resume", {"saga_id": "o-1"})
    web.shop.driver.run_until_idle()

    # then
    record = web.shop.record("o-1")
    assert record.state == SagaState.COMPENSATED
    assert record.step("shop.charge").error_code == "lost"  # type: ignore[union-attr]


def test_a_stale_effect_id_is_refused_with_the_facade_refusal_and_changes_nothing(
        web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # given
    in_review(web.shop)
    version = web.shop.record("o-1").version

    # when
    with caplog.at_level(logging.INFO, logger="celery_sagas.web"):
        response = web.post("/actions/resolve", resolve_form("0b7e6f1c-5d1a-4c3e-9a43-2f6d0f1e8a11"))

    # then
    assert response.status_code == 409
    assert "Refused, nothing changed" in response.get_data(as_text=True)
    assert web.shop.record("o-1").version == version
    [refused] = [r for r in caplog.records if getattr(r, "web_outcome", None) == "refused"]
    assert (refused.web_action, refused.web_principal) == ("resolve", "olive")  # type: ignore[attr-defined]


def test_resume_with_an_unresolved_step_is_refused(web: Web) -> None:
    # given
    in_review(web.shop)

    # then
    response = web.post("/actions/resume", {"saga_id": "o-1"})
    assert response.status_code == 409
    assert "resolve it first" in response.get_data(as_text=True)


@pytest.mark.parametrize(("changes", "message"), [
    ({"result": "{not json"}, "result is not JSON"),
    ({"outcome": "maybe"}, "choose the outcome"),
    ({"outcome": ""}, "choose the outcome"),
    ({"saga_id": ""}, "the form needs saga id"),
    ({"effect_id": " "}, "the form needs effect id"),
])
def test_bad_forms_are_a_400(web: Web, changes: dict[str, str], message: str) -> None:
    # given
    effect = in_review(web.shop)

    # then
    response = web.post("/actions/resolve", resolve_form(effect, **changes))
    assert response.status_code == 400
    assert message in response.get_data(as_text=True)
    assert web.shop.record("o-1").state == SagaState.MANUAL_REVIEW


def test_an_unknown_saga_is_a_404(web: Web) -> None:
    # then
    assert web.post("/actions/cancel", {"saga_id": "nope"}).status_code == 404


def test_cancel_compensates_and_returns_to_the_queue_when_asked(web: Web) -> None:
    # given
    gated(web.shop)

    # when
    response = web.post("/actions/cancel", {"saga_id": "g-1", "back": "attention"})
    web.shop.driver.run_until_idle()

    # then
    assert response.headers["Location"] == "/attention?done=cancel"
    assert web.shop.record("g-1").state == SagaState.COMPENSATED


def test_approve_decides_in_the_approvals_tenant_as_the_operator(web: Web) -> None:
    # given
    gated(web.shop)
    [pending] = web.sagas.approvals.pending("g-1")

    # when
    response = web.post("/actions/approve", {"approval_id": pending.approval_id})

    # then
    assert response.headers["Location"] == "/saga?id=g-1&done=approve"
    approval = web.sagas.approvals.get(pending.approval_id)
    assert approval is not None and (approval.state, approval.decided_by) == ("approved", "olive")
    web.sagas.approvals.resume("g-1", pending.token, tenant_id="t1", principal_id="p1")
    web.shop.driver.run_until_idle()
    assert web.shop.record("g-1").state == SagaState.COMPLETED
    again = web.post("/actions/approve", {"approval_id": pending.approval_id})
    assert again.status_code == 409


def test_deny_compensates_what_came_before_the_gate(web: Web) -> None:
    # given
    gated(web.shop)
    [pending] = web.sagas.approvals.pending("g-1")

    # when
    web.post("/actions/deny", {"approval_id": pending.approval_id})
    web.shop.driver.run_until_idle()

    # then
    record = web.shop.record("g-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "approval_denied")


def test_an_unknown_approval_is_a_404(web: Web) -> None:
    # then
    assert web.post("/actions/approve", {"approval_id": "nope"}).status_code == 404


def test_every_action_is_emitted_to_the_observers_with_who_did_it(web: Web) -> None:
    # given
    seen: list[OperatorAction] = []
    app = create_app(web.sagas, users=USERS, secret=CSRF_SECRET, on_action=[seen.append])
    client = Web(web.shop, app, app.test_client())
    gated(web.shop)
    [pending] = web.sagas.approvals.pending("g-1")

    # when
    client.post("/actions/deny", {"approval_id": pending.approval_id})
    web.shop.driver.run_until_idle()
    client.post("/actions/cancel", {"saga_id": "nope"})
    client.post("/actions/resume", {"saga_id": "g-1"}, csrf=False)
    client.post("/actions/resume", {"saga_id": "g-1"}, user="rita")

    # then: done, refused by the facade, refused at the door; who did it each time
    assert [(e.action, e.principal, e.saga_id, e.outcome, e.error) for e in seen] == [
        ("deny", "olive", "g-1", "done", None),
        ("cancel", "olive", "nope", "refused", "SagaNotFound"),
        ("resume", "olive", "g-1", "refused", "csrf"),
        ("resume", "rita", "g-1", "refused", "read-only"),
    ]
    assert seen[0].approval_id == pending.approval_id and seen[0].role == "operator"


def test_an_observer_that_raises_changes_nothing(web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # given
    def broken(event: OperatorAction) -> None:
        raise RuntimeError("observer down")

    app = create_app(web.sagas, users=USERS, secret=CSRF_SECRET, on_action=[broken])
    client = Web(web.shop, app, app.test_client())
    gated(web.shop)

    # when
    response = client.post("/actions/cancel", {"saga_id": "g-1"})

    # then
    assert response.status_code == 303
    assert "action observer" in caplog.text


# ---------------------------------------------------------------- signals, where they exist


def signal_waiter(web: Web, saga_id: str = "sw-1") -> None:
    """A saga waiting for the signal ``go`` (a minute at most)."""

    @web.sagas.saga("web-signal-waiter")
    def waiter(ctx: Any, data: Any) -> Any:
        return ctx.wait_signal("go", timeout=60)

    waiter.start({}, saga_id=saga_id)
    web.shop.driver.run_until_idle()


def test_the_signal_form_records_a_signal_in_the_saga(web: Web) -> None:
    # given
    signal_waiter(web)

    # when
    page = web.get("/saga?id=sw-1").get_data(as_text=True)
    response = web.post("/actions/signal", {"saga_id": "sw-1", "name": "go",
                                            "payload": '{"n": 1}', "signal_id": "s-1"})

    # then
    assert 'name="name" value="go"' in page and "Send signal go" in page
    assert response.status_code == 303
    record = web.sagas.get("sw-1")
    assert [(s.signal_id, s.name, s.payload) for s in record.signals] == [("s-1", "go", {"n": 1})]


class _Signalling:
    """A facade with ``signal`` (as the coming version has), recording what it was sent."""

    def __init__(self, sagas: Any) -> None:
        self._sagas = sagas
        self.sent: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sagas, name)

    def signal(self, saga_id: str, name: str, payload: Any = None, signal_id: str | None = None,
               *, actor: str | None = None) -> None:
        self.sent.append((saga_id, name, payload, signal_id, actor))


def test_where_the_facade_has_signals_the_form_sends_one(web: Web) -> None:
    # given
    signal_waiter(web, "g-1")
    facade = _Signalling(web.sagas)
    app = create_app(facade, users=USERS, secret=CSRF_SECRET)  # type: ignore[arg-type]
    client = Web(web.shop, app, app.test_client())

    # when
    page = client.get("/saga?id=g-1").get_data(as_text=True)
    response = client.post("/actions/signal", {"saga_id": "g-1", "name": "go",
                                               "payload": '{"zip": "1000"}', "signal_id": "s-1"})

    # then
    assert 'value="signal"' in page
    assert response.status_code == 303
    assert facade.sent == [("g-1", "go", {"zip": "1000"}, "s-1", "olive")]


def test_a_refused_id_from_the_request_is_logged_as_its_repr(
        web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # when
    with caplog.at_level(logging.INFO, logger="celery_sagas.web"):
        response = web.post("/actions/resume", {"saga_id": "o-1\nFAKE: admin resumed everything"})

    # then
    assert response.status_code == 400
    [refused] = [r for r in caplog.records if getattr(r, "web_outcome", None) == "refused"]
    assert "\n" not in refused.getMessage()
    assert refused.saga_id == repr("o-1\nFAKE: admin resumed everything")  # type: ignore[attr-defined]


@pytest.mark.parametrize("action", ["cancel", "deny", "resolve"])
def test_cancel_deny_and_resolve_first_show_a_confirmation_page_and_change_nothing(
        web: Web, action: str) -> None:
    # given
    gated(web.shop)
    effect = in_review(web.shop)
    [pending] = web.sagas.approvals.pending("g-1")
    form = {"cancel": {"saga_id": "g-1"}, "deny": {"approval_id": pending.approval_id},
            "resolve": resolve_form(effect)}[action]
    versions = (web.shop.record("g-1").version, web.shop.record("o-1").version)

    # when
    page = web.post(f"/actions/{action}", form, confirmed=False)

    # then: a page with the same fields and a confirming button; nothing written
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and 'name="confirmed" value="yes"' in text
    for value in form.values():
        assert f'value="{escape(value)}"' in text
    assert (web.shop.record("g-1").version, web.shop.record("o-1").version) == versions

    # and: its button does it
    confirmed = web.post(f"/actions/{action}", {**form, "confirmed": "yes"})
    assert confirmed.status_code == 303


def test_a_running_saga_offers_cancel_but_not_resume(web: Web) -> None:
    # given
    gated(web.shop)

    # when
    text = web.get("/saga?id=g-1").get_data(as_text=True)

    # then
    assert 'value="cancel"' in text and 'value="resume"' not in text


def test_an_unresolved_ambiguity_offers_only_its_resolve_form_and_says_why(web: Web) -> None:
    # given
    in_review(web.shop)

    # when
    text = web.get("/saga?id=o-1").get_data(as_text=True)

    # then
    assert 'value="resolve"' in text
    assert 'value="resume"' not in text and 'value="cancel"' not in text
    assert "Resolve shop.charge first" in text
    assert '<option value="" selected disabled>' in text  # the outcome has no default


def test_a_final_saga_offers_nothing_and_says_so(web: Web) -> None:
    # given
    web.shop.start_order("done-1", id="done-1")
    web.shop.driver.run_until_idle()

    # when
    text = web.get("/saga?id=done-1").get_data(as_text=True)

    # then
    assert 'method="post"' not in text
    assert "nothing is left to do" in text


def test_the_signed_in_operator_and_the_reason_go_to_the_saga_history(web: Web) -> None:
    # given
    gated(web.shop)

    # when
    web.post("/actions/cancel", {"saga_id": "g-1", "reason": "customer called to cancel"})

    # then
    [entry] = [e for e in web.sagas.history("g-1") if str(e.event) == "cancel"]
    assert (entry.actor, entry.reason) == ("olive", "customer called to cancel")


def test_a_resolved_saga_left_idle_offers_resume_to_drive_it_on(web: Web) -> None:
    # given: resolved, nothing dispatched yet (resolve does not advance)
    effect = in_review(web.shop)
    web.post("/actions/resolve", resolve_form(effect))

    # when
    text = web.get("/saga?id=o-1").get_data(as_text=True)

    # then
    assert 'value="resume"' in text
    web.post("/actions/resume", {"saga_id": "o-1"})
    web.shop.driver.run_until_idle()
    assert web.shop.record("o-1").state == SagaState.COMPLETED
