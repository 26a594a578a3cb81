"""URLs of the contrib tests: an echo WSGI app mounted behind Django's login at ``ops/``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery
from django.urls import include, path

from celery_sagas import Sagas
from celery_sagas.contrib.django.ui import PRINCIPAL_KEY, mount_wsgi, operator_ui_urls, staff_role

UI_SAGAS = Sagas(Celery("contrib-ui", broker="memory://localhost/"), store="memory://",
                 allow_non_durable=True)
# The project's app, made current by a test before its first request (docs/django.md mounts
# ``operator_ui_urls()`` without arguments: the current Celery app's sagas).
PROJECT_SAGAS = Sagas(Celery("contrib-project", broker="memory://localhost/"), store="memory://",
                      allow_non_durable=True)


def echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Answers with what a mounted WSGI app sees of the request."""
    size = int(environ.get("CONTENT_LENGTH") or 0)
    principal = environ.get(PRINCIPAL_KEY)
    seen = {
        "method": environ["REQUEST_METHOD"], "script_name": environ["SCRIPT_NAME"],
        "path_info": environ["PATH_INFO"], "query": environ["QUERY_STRING"],
        "body": environ["wsgi.input"].read(size).decode(), "principal": principal,
    }
    start_response("201 Created", [("Content-Type", "application/json"), ("X-Echo", "1"),
                                   ("Set-Cookie", "echo=1; Path=/")])
    return [json.dumps(seen).encode()]


def principal(request: Any) -> Any:
    """The role of the user, as the operator UI would get it."""
    role = staff_role(request.user)
    return None if role is None else f"{request.user.get_username()}:{role}"


urlpatterns = [
    path("ops/sagas/", include(operator_ui_urls())),  # docs/django.md, word for word
    path("ops/", include(mount_wsgi(lambda: echo, principal=principal))),
    path("ui/", include(operator_ui_urls(UI_SAGAS))),
]
