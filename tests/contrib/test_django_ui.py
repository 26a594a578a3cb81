"""A WSGI app (the operator UI) under a Django URL (docs/django.md): Django's login decides
who gets in and with which role; the app sees its mount point, the path, the body and the
principal; Django's CSRF check leaves it to the app."""

from __future__ import annotations

import json
import re
import sys
import uuid
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory

from celery_sagas.contrib.django.ui import operator_ui_urls


def _user(**flags: bool) -> User:
    return User.objects.create_user(f"u{uuid.uuid4().hex[:8]}", password="x", **flags)


@pytest.fixture
def client(migrated: None) -> Client:
    """A Django test client that enforces CSRF checks, as a browser meets them."""
    return Client(enforce_csrf_checks=True)


def test_anonymous_users_are_sent_to_the_login_page(client: Client) -> None:
    # when
    response = client.get("/ops/sagas?state=running")

    # then
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/ops/sagas")


def test_users_without_a_role_are_refused(client: Client) -> None:
    # given
    client.force_login(_user())

    # when
    response = client.get("/ops/")

    # then
    assert response.status_code == 403


def test_staff_reach_the_app_at_its_mount_point_as_their_principal(client: Client) -> None:
    # given
    staff = _user(is_staff=True)
    client.force_login(staff)

    # when
    response = client.get("/ops/saga/a%2Fb?x=1")

    # then
    seen = json.loads(response.content)
    assert response.status_code == 201 and response["X-Echo"] == "1"
    assert response.cookies["echo"].value == "1"
    assert seen == {"method": "GET", "script_name": "/ops", "path_info": "/saga/a/b", "query": "x=1",
                    "body": "", "principal": f"{staff.username}:readonly"}


def test_posts_reach_the_app_without_django_s_csrf_token(client: Client) -> None:
    # given
    admin = _user(is_staff=True, is_superuser=True)
    client.force_login(admin)

    # when
    form = urlencode({"saga_id": "s-1", "csrf_token": "the app's"})
    response = client.post("/ops/actions/resume", form,
                           content_type="application/x-www-form-urlencoded")

    # then
    seen: dict[str, Any] = json.loads(response.content)
    assert response.status_code == 201
    assert seen["method"] == "POST" and seen["principal"] == f"{admin.username}:operator"
    assert seen["body"] == form


# ------------------------------------------------------------ the operator UI


class FakeWeb:
    """What operator_ui_urls needs of celery_sagas.web: create_app(sagas, authenticate=) and
    Principal(name, role)."""

    def __init__(self) -> None:
        self.built: list[Any] = []

    @staticmethod
    def Principal(name: str, role: str) -> tuple[str, str]:  # the web module's class
        return (name, role)

    def create_app(self, sagas: Any, *, authenticate: Any) -> Any:
        self.built.append(sagas)

        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            who = authenticate(SimpleNamespace(environ=environ))
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [f"{who} at {environ['SCRIPT_NAME']}{environ['PATH_INFO']}".encode()]

        return app


def test_the_operator_ui_authenticates_the_django_user_as_its_principal(
        migrated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the UI module as the web extra provides it, mounted at /ops/ui/
    web = FakeWeb()
    monkeypatch.setitem(sys.modules, "celery_sagas.web", web)
    sagas = object()
    [pattern] = operator_ui_urls(sagas)
    admin, reader = _user(is_staff=True, is_superuser=True), _user(is_staff=True)

    # when
    seen = []
    for user in (admin, reader, admin):
        request = RequestFactory().get("/ops/ui/sagas")
        request.user = user
        seen.append(pattern.callback(request, subpath="sagas").content.decode())

    # then: built once, on the first request
    assert web.built == [sagas]
    assert seen == [f"('{admin.username}', 'operator') at /ops/ui/sagas",
                    f"('{reader.username}', 'readonly') at /ops/ui/sagas",
                    f"('{admin.username}', 'operator') at /ops/ui/sagas"]


def test_without_the_web_ui_the_mount_says_what_to_install(
        migrated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.setitem(sys.modules, "celery_sagas.web", None)  # import fails
    [pattern] = operator_ui_urls(object())
    request = RequestFactory().get("/ops/ui/")
    request.user = _user(is_staff=True, is_superuser=True)

    # when / then
    with pytest.raises(ImproperlyConfigured, match=r"celery-sagas\[web\]"):
        pattern.callback(request, subpath="")


def test_the_real_operator_ui_serves_its_overview_to_staff(client: Client) -> None:
    # given
    pytest.importorskip("celery_sagas.web", reason="the operator UI is not in this tree yet")
    client.force_login(_user(is_staff=True))

    # when
    response = client.get("/ui/")

    # then: the page, and the stylesheet it links under the mount point
    assert response.status_code == 200
    assert b"csrf_token" not in response.content  # a read-only user gets no action forms
    [stylesheet] = re.findall(r'href="(/ui/static/[^"]+\.css)"', response.content.decode())
    assert client.get(stylesheet).status_code == 200


def test_the_ui_mounted_as_the_docs_show_serves_the_current_app_s_sagas_to_staff(
    client: Client,
) -> None:
    # given: urls.py as docs/django.md has it, ``include(operator_ui_urls())`` with no argument,
    # and the project's Celery app current (issue 25 item 6: it answered 500)
    pytest.importorskip("celery_sagas.web", reason="the operator UI is not in this tree yet")
    from tests.contrib.urls import PROJECT_SAGAS

    PROJECT_SAGAS.app.set_current()
    client.force_login(_user(is_staff=True))

    # when
    response = client.get("/ops/sagas/")

    # then
    assert response.status_code == 200
    assert b"/ops/sagas/static/" in response.content
