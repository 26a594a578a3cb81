"""The request guard: origin of every POST, session-bound rotating CSRF tokens, throttled
logins, allowed hosts, and nothing from a URL in a log line unchecked."""

from __future__ import annotations

import logging

import pytest

from celery_sagas import SagaState
from celery_sagas.web import create_app
from celery_sagas.web._auth import SESSION_COOKIE
from celery_sagas.web._throttle import LoginThrottle
from tests.web.conftest import CSRF_SECRET, USERS, Web, basic, gated, in_review


@pytest.mark.parametrize(("headers"), [
    {"Origin": "http://evil.example"},
    {"Origin": "null", "Referer": "http://evil.example/page"},
    {"Referer": "http://evil.example/page"},
    {},
])
def test_a_post_from_another_origin_is_refused_even_with_a_valid_token(
        web: Web, headers: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    # given
    in_review(web.shop)
    token = web.csrf()

    # when
    with caplog.at_level(logging.WARNING, logger="celery_sagas.web"):
        response = web.client.post("/actions/cancel", data={"saga_id": "o-1", "csrf_token": token},
                                   headers={**basic("olive"), **headers})

    # then
    assert response.status_code == 403
    assert "not sent from a page of this app" in response.get_data(as_text=True)
    assert web.shop.record("o-1").state == SagaState.MANUAL_REVIEW
    assert any(getattr(r, "error", None) == "origin" for r in caplog.records)


def test_a_same_origin_referer_passes_where_the_origin_is_null(web: Web) -> None:
    # given
    gated(web.shop)
    token = web.csrf()

    # when
    response = web.client.post("/actions/cancel",
                               data={"saga_id": "g-1", "csrf_token": token, "confirmed": "yes"},
                               headers={**basic("olive"), "Origin": "null",
                                        "Referer": "http://localhost/saga?id=g-1"})

    # then
    assert response.status_code == 303


def test_an_action_rotates_the_session_so_an_old_form_no_longer_posts(web: Web) -> None:
    # given
    gated(web.shop, "g-1")
    gated(web.shop, "g-2")
    token = web.csrf()
    first = web.post("/actions/cancel", {"saga_id": "g-1", "csrf_token": token, "confirmed": "yes"})

    # when
    again = web.post("/actions/cancel", {"saga_id": "g-2", "csrf_token": token, "confirmed": "yes"})

    # then
    assert first.status_code == 303 and SESSION_COOKIE in first.headers["Set-Cookie"]
    assert again.status_code == 403
    assert web.shop.record("g-2").state == SagaState.RUNNING


def test_the_session_cookie_is_http_only_and_same_site_strict(web: Web) -> None:
    # when
    cookie = web.get("/").headers["Set-Cookie"]

    # then
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_a_forged_action_segment_never_reaches_a_log_line(
        web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # given: a cross-site form posting to a URL whose last segment holds a newline
    forged = "/actions/resume%0Aweb:%20approve%20of%20saga%20order-1000%20by%20boss"

    # when
    with caplog.at_level(logging.INFO, logger="celery_sagas.web"):
        response = web.client.post(forged, data={"saga_id": "o-1"},
                                   headers={**basic("olive"), "Origin": "http://evil.example"})

    # then
    assert response.status_code == 403
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line and "boss" not in line for line in lines)
    assert all(getattr(r, "web_action", "") in ("", "unknown") for r in caplog.records)


def test_failed_logins_are_logged_with_the_user_and_throttled_per_user(
        web: Web, caplog: pytest.LogCaptureFixture) -> None:
    # when
    with caplog.at_level(logging.WARNING, logger="celery_sagas.web"):
        codes = [web.client.get("/", headers=basic("olive", f"guess-{n}")).status_code
                 for n in range(12)]
        right = web.client.get("/", headers=basic("olive")).status_code

    # then: ten failures, then refused even with the right password
    assert codes[:10] == [401] * 10 and codes[10:] == [429, 429]
    assert right == 429
    assert any("failed login of user olive" in r.getMessage() for r in caplog.records)
    assert web.get("/", "rita").status_code == 200  # another user from the same address: not yet


def test_the_throttle_counts_per_address_and_forgets_after_its_window() -> None:
    # given
    throttle = LoginThrottle(user_limit=100, address_limit=3, window_s=60)
    for n in range(3):
        throttle.failed(f"user-{n}", "10.0.0.1", now_s=1000.0 + n)

    # then
    assert throttle.retry_after("someone", "10.0.0.1", 1003.0) > 0
    assert throttle.retry_after("someone", "10.0.0.2", 1003.0) == 0
    assert throttle.retry_after("someone", "10.0.0.1", 1061.0) == 0


def test_a_host_not_allowed_is_refused_before_authentication(web: Web) -> None:
    # given
    app = create_app(web.sagas, users=USERS, secret=CSRF_SECRET, allowed_hosts=["sagas.internal"])
    client = app.test_client()

    # then
    assert client.get("/", headers=basic("olive")).status_code == 400
    assert client.get("/", headers=basic("olive"),
                      base_url="http://sagas.internal:8025").status_code == 200


def test_the_server_header_names_no_version() -> None:
    # given
    from celery_sagas.web._serve import SERVER, Handler

    # then
    assert Handler.version_string(None) == SERVER == "celery-sagas"  # type: ignore[arg-type]


def test_serve_logs_actions_at_info_without_logging_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: no handler anywhere, the web logger at its default level
    from celery_sagas.web import _serve

    root, web_logger = logging.getLogger(), logging.getLogger("celery_sagas.web")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(web_logger, "level", logging.NOTSET)
    served: list[object] = []
    monkeypatch.setattr(_serve, "run_simple", lambda *a, **k: served.append(k["request_handler"]))

    # when
    _serve.serve(object(), "127.0.0.1", 8025)  # type: ignore[arg-type]

    # then: INFO lines of celery_sagas.web reach stderr; the handler names no version
    assert web_logger.getEffectiveLevel() == logging.INFO and root.handlers
    assert served == [_serve.Handler]
    for handler in list(root.handlers):
        root.removeHandler(handler)
