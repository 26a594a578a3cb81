"""Every page needs authentication; actions need the operator role and the CSRF token."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from flask import Request

from celery_sagas import SagaState
from celery_sagas.errors import SagaConfigurationError, SagaValidationError
from celery_sagas.web import Principal, WebUser, create_app, parse_users
from celery_sagas.web._auth import SESSION_COOKIE, CsrfTokens, users_from_environment
from tests.web.conftest import CSRF_SECRET, USERS, Web, basic, gated, in_review

PAGES = ["/", "/sagas", "/saga?id=o-1", "/attention", "/static/style.css", "/nowhere"]
ACTIONS = ["/actions/resolve", "/actions/resume", "/actions/cancel", "/actions/approve",
           "/actions/deny", "/actions/signal"]


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_requests_without_credentials_get_401_and_a_basic_challenge(web: Web, path: str) -> None:
    # when
    response = web.client.post(path) if path.startswith("/actions") else web.get(path, user=None)

    # then
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith('Basic realm="celery-sagas"')
    assert "saga" not in response.get_data(as_text=True).lower()


@pytest.mark.parametrize("header", [basic("olive", "wrong"), basic("rita", "olive-pw"),
                                    {"Authorization": "Basic !!!"},
                                    {"Authorization": "Bearer olive-pw"}])
def test_wrong_or_malformed_credentials_get_401(web: Web, header: dict[str, str]) -> None:
    # then
    assert web.client.get("/", headers=header).status_code == 401


def test_an_unknown_user_gets_401_like_a_wrong_password(web: Web) -> None:
    # given
    raw = {"Authorization": "Basic " + __import__("base64").b64encode(b"mallory:x").decode()}

    # then
    assert web.client.get("/", headers=raw).status_code == 401


@pytest.mark.parametrize("path", ["/", "/sagas", "/saga?id=o-1", "/saga?id=g-1", "/attention"])
def test_a_readonly_user_sees_every_page_without_action_forms(web: Web, path: str) -> None:
    # given
    in_review(web.shop)
    gated(web.shop)

    # when
    page = web.get(path, user="rita")
    text = page.get_data(as_text=True)

    # then
    assert page.status_code == 200
    assert 'method="post"' not in text
    assert "csrf_token" not in text
    assert "rita · readonly" in text


def test_an_operator_sees_the_forms(web: Web) -> None:
    # given
    in_review(web.shop)

    # then
    text = web.get("/saga?id=o-1").get_data(as_text=True)
    assert text.count('method="post"') >= 1
    [token] = set(re.findall(r'name="csrf_token" value="([^"]+)"', text))
    session = web.client.get_cookie(SESSION_COOKIE).value  # type: ignore[union-attr]
    assert CsrfTokens(CSRF_SECRET).valid(Principal("olive", "operator"), session, token,
                                         int(time.time()))


@pytest.mark.parametrize("path", ACTIONS)
def test_a_readonly_user_cannot_post_even_with_a_token(web: Web, path: str) -> None:
    # given
    effect = in_review(web.shop)
    token = web.csrf("rita")

    # when
    response = web.post(path, {"saga_id": "o-1", "step": "shop.charge", "effect_id": effect,
                               "outcome": "committed", "csrf_token": token}, user="rita")

    # then
    assert response.status_code == 403
    assert "Read-only users cannot act" in response.get_data(as_text=True)
    assert web.shop.record("o-1").state == SagaState.MANUAL_REVIEW


@pytest.mark.parametrize("token", [None, "", "0" * 64, "not-hex", "é" * 64, "rita"])
def test_an_action_without_the_right_csrf_token_is_refused(web: Web, token: str | None,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    # given
    effect = in_review(web.shop)
    version = web.shop.record("o-1").version
    form = {"saga_id": "o-1", "step": "shop.charge", "effect_id": effect, "outcome": "committed"}
    if token == "rita":
        token = web.csrf("rita")
    if token is not None:
        form["csrf_token"] = token

    # when
    with caplog.at_level(logging.WARNING, logger="celery_sagas.web"):
        response = web.post("/actions/resolve", form, csrf=False)

    # then
    assert response.status_code == 403
    assert "CSRF" in response.get_data(as_text=True)
    assert web.shop.record("o-1").version == version
    assert any("csrf" in r.getMessage() and "olive" in r.getMessage() for r in caplog.records)


def test_a_token_from_another_process_secret_is_refused(web: Web, shop: object) -> None:
    # given
    in_review(web.shop)
    mine = web.csrf()
    session = web.client.get_cookie(SESSION_COOKIE).value  # type: ignore[union-attr]
    other = CsrfTokens(b"another-secret-of-at-least-32-bytes!!").token_for(
        Principal("olive", "operator"), session, int(mine.split(".")[0]))

    # then
    response = web.post("/actions/resume", {"saga_id": "o-1", "csrf_token": other}, csrf=False)
    assert response.status_code == 403


def test_every_response_forbids_scripts_framing_and_caching(web: Web) -> None:
    # when
    headers = web.get("/").headers

    # then
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "script-src" not in headers["Content-Security-Policy"]
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-store"


# ---------------------------------------------------------------- the mounting app's callable


def test_a_callable_from_the_mounting_app_decides_who_is_in(web: Web) -> None:
    # given
    seen: list[str] = []

    def authenticate(request: Request) -> Principal | None:
        seen.append(request.path)
        return Principal("sso-ann", "operator") if request.headers.get("X-User") == "ann" else None

    app = create_app(web.sagas, authenticate=authenticate)
    client = app.test_client()

    # then
    refused = client.get("/")
    assert refused.status_code == 401 and "WWW-Authenticate" not in refused.headers
    page = client.get("/", headers={"X-User": "ann"})
    assert page.status_code == 200 and "sso-ann · operator" in page.get_data(as_text=True)
    assert seen == ["/", "/"]


def test_users_and_a_callable_together_are_refused(web: Web) -> None:
    # then
    with pytest.raises(SagaConfigurationError, match="not both"):
        create_app(web.sagas, users=USERS, authenticate=lambda request: None)


# ---------------------------------------------------------------- users and secrets


def test_users_come_from_the_environment(web: Web) -> None:
    # given
    environ = {"CELERY_SAGAS_WEB_USERS": "ann:pw:with:colons:operator, bob:s3cret:readonly"}

    # when
    users = users_from_environment(environ)

    # then
    assert users == (WebUser("ann", "pw:with:colons", "operator"), WebUser("bob", "s3cret", "readonly"))
    assert "s3cret" not in repr(users)


def test_users_come_from_a_file_one_per_line(tmp_path: Path) -> None:
    # given
    path = tmp_path / "users"
    path.write_text("# operators\nann:pw,with,commas:operator\n\nbob:x:readonly\n")

    # when
    users = users_from_environment({"CELERY_SAGAS_WEB_USERS_FILE": str(path)})

    # then
    assert [(u.name, u.password, u.role) for u in users] == [
        ("ann", "pw,with,commas", "operator"), ("bob", "x", "readonly")]


@pytest.mark.parametrize(("text", "message"), [
    ("ann:hunter2", "entry 1 is not name:password:role"),
    ("ann:hunter2:admin", "a web role is one of operator, readonly"),
    ("ann::operator", "empty password"),
    ("a n:hunter2:operator", "web user name"),
    ("ann:hunter2:operator,ann:hunter2:readonly", "appears twice"),
])
def test_bad_user_entries_are_refused_without_quoting_the_password(text: str, message: str) -> None:
    # then
    with pytest.raises(SagaConfigurationError, match=message) as caught:
        parse_users(text, source="CELERY_SAGAS_WEB_USERS")
    assert "hunter2" not in str(caught.value)


def test_without_users_the_app_refuses_to_start(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.delenv("CELERY_SAGAS_WEB_USERS", raising=False)
    monkeypatch.delenv("CELERY_SAGAS_WEB_USERS_FILE", raising=False)

    # then
    with pytest.raises(SagaConfigurationError, match="the web UI needs users"):
        create_app(web.sagas)


def test_both_user_sources_at_once_are_refused(tmp_path: Path) -> None:
    # then
    with pytest.raises(SagaConfigurationError, match="not both"):
        users_from_environment({"CELERY_SAGAS_WEB_USERS": "a:b:operator",
                                "CELERY_SAGAS_WEB_USERS_FILE": str(tmp_path / "u")})


def test_an_unreadable_users_file_is_a_configuration_error(tmp_path: Path) -> None:
    # then
    with pytest.raises(SagaConfigurationError, match="cannot read"):
        users_from_environment({"CELERY_SAGAS_WEB_USERS_FILE": str(tmp_path / "missing")})


def test_a_short_csrf_secret_is_refused(web: Web) -> None:
    # then
    with pytest.raises(SagaConfigurationError, match="at least 32 bytes"):
        create_app(web.sagas, users=USERS, secret=b"short")


def test_tokens_differ_by_principal_session_and_secret_and_survive_a_restart() -> None:
    # given
    ann, bob = Principal("ann", "operator"), Principal("bob", "operator")
    first, again, other = CsrfTokens(CSRF_SECRET), CsrfTokens(CSRF_SECRET), CsrfTokens()
    s1, s2, now = "1" * 32, "2" * 32, 1_700_000_000

    # then
    assert first.token_for(ann, s1, now) == again.token_for(ann, s1, now)
    assert first.token_for(ann, s1, now) != first.token_for(bob, s1, now)
    assert first.token_for(ann, s1, now) != first.token_for(ann, s2, now)
    assert first.token_for(ann, s1, now) != other.token_for(ann, s1, now)
    assert first.valid(ann, s1, again.token_for(ann, s1, now), now + 10)
    assert not first.valid(ann, s1, first.token_for(bob, s1, now), now)
    assert not first.valid(ann, s2, first.token_for(ann, s1, now), now)
    assert not first.valid(ann, None, first.token_for(ann, s1, now), now)


def test_a_token_expires_after_its_time_to_live() -> None:
    # given
    ann, session, now = Principal("ann", "operator"), "1" * 32, 1_700_000_000
    tokens = CsrfTokens(CSRF_SECRET, ttl_s=600)
    token = tokens.token_for(ann, session, now)

    # then
    assert tokens.valid(ann, session, token, now + 600)
    assert not tokens.valid(ann, session, token, now + 601)
    assert not tokens.valid(ann, session, token, now - 3600)  # issued far in the future


@pytest.mark.parametrize(("name", "role"), [("a b", "operator"), ("ann", "admin"), ("", "readonly")])
def test_a_principal_needs_a_valid_name_and_role(name: str, role: str) -> None:
    # then
    with pytest.raises(SagaValidationError):
        Principal(name, role)
