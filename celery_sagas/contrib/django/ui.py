"""The operator web UI (``celery_sagas.web``) under a Django URL, behind Django's login.

    urlpatterns = [path("ops/sagas/", include(operator_ui_urls()))]

Every request under that path is handed to the UI's WSGI app with ``SCRIPT_NAME`` set to the
mount point. Django authenticates: ``role_of(user)`` says what a user may do there (default:
superusers act, other active staff read, everyone else is refused), and the UI receives the
user as its principal instead of asking for HTTP basic credentials. The UI checks its own CSRF
token on every action, so the mount is exempt from Django's. ``mount_wsgi`` mounts any other
WSGI app the same way.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Iterable
from importlib import import_module
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, re_path
from django.views.decorators.csrf import csrf_exempt

__all__ = ["OPERATOR", "PRINCIPAL_KEY", "READONLY", "mount_wsgi", "operator_ui_urls", "staff_role"]

OPERATOR = "operator"
READONLY = "readonly"
PRINCIPAL_KEY = "celery_sagas.principal"  # the WSGI environ key the UI reads its principal from

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
RoleOf = Callable[[Any], "str | None"]
Principal = Callable[[HttpRequest], Any]


def staff_role(user: Any) -> str | None:
    """Superusers operate, other active staff read, anyone else is refused."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return None
    return OPERATOR if user.is_superuser else READONLY


def operator_ui_urls(sagas: Any = None, *, role_of: RoleOf = staff_role) -> list[URLPattern]:
    """URL patterns serving the operator UI of ``sagas`` (default: the current Celery app's),
    for ``include()`` under any path; the UI is built on the first request."""

    def build() -> tuple[WSGIApp, Callable[[str, str], Any]]:
        try:  # another part of the package, present with the web UI
            web = import_module("celery_sagas.web")
        except ImportError as exc:
            raise ImproperlyConfigured(
                "the saga operator UI needs celery_sagas.web and Flask: pip install 'celery-sagas[web]'"
            ) from exc
        facade = sagas if sagas is not None else _current_sagas()
        app = web.create_app(facade, authenticate=lambda request: request.environ.get(PRINCIPAL_KEY))
        return app, web.Principal

    lazy = _Lazy(build)

    def principal(request: HttpRequest) -> Any:
        role = role_of(request.user)
        return None if role is None else lazy.get()[1](request.user.get_username(), role)

    return mount_wsgi(lambda: lazy.get()[0], principal=principal)


def mount_wsgi(app: Callable[[], WSGIApp], *, principal: Principal | None = None) -> list[URLPattern]:
    """URL patterns handing every request under their ``include()`` path to the WSGI app that
    ``app()`` returns. With ``principal``, a request whose ``principal(request)`` is None is sent
    to the login page (anonymous) or refused (403); otherwise the value is put in the environ
    under ``PRINCIPAL_KEY``."""

    @csrf_exempt  # type: ignore[untyped-decorator]  # the UI checks its own CSRF token
    def view(request: HttpRequest, subpath: str) -> HttpResponse:
        environ = _environ(request, subpath)
        if principal is not None:
            who = principal(request)
            if who is None:
                if not request.user.is_authenticated:
                    return redirect_to_login(request.get_full_path())
                return HttpResponse("forbidden\n", status=403, content_type="text/plain")
            environ[PRINCIPAL_KEY] = who
        return _call(app(), environ)

    return [re_path(r"^(?P<subpath>.*)$", view, name="celery_sagas_ui")]


def _current_sagas() -> Any:
    from celery import current_app

    from ..._celery.facade import sagas_of

    return sagas_of(current_app)


class _Lazy:
    """A value built once, on first use, by one thread."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._value: Any = None

    def get(self) -> Any:
        with self._lock:
            if self._value is None:
                self._value = self._build()
            return self._value


def _environ(request: HttpRequest, subpath: str) -> dict[str, Any]:
    """The WSGI environ of ``request`` as the mounted app sees it: SCRIPT_NAME is the mount
    point, PATH_INFO what follows, the body readable again."""
    body = request.body
    environ = {key: value for key, value in request.META.items() if not key.startswith("wsgi.")}
    mount = request.path[: len(request.path) - len(subpath)].rstrip("/")
    environ.update({
        "REQUEST_METHOD": request.method or "GET",
        "SCRIPT_NAME": mount,
        "PATH_INFO": "/" + subpath,
        "QUERY_STRING": request.META.get("QUERY_STRING", ""),
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": request.META.get("SERVER_NAME", "localhost"),
        "SERVER_PORT": str(request.META.get("SERVER_PORT", "80")),
        "SERVER_PROTOCOL": request.META.get("SERVER_PROTOCOL", "HTTP/1.1"),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": request.scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    })
    return environ


def _call(app: WSGIApp, environ: dict[str, Any]) -> HttpResponse:
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda chunk: None

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    response = HttpResponse(body, status=int(status.split(" ", 1)[0]))
    for name, value in headers:
        if name.lower() == "set-cookie":
            response.cookies.load(value)
        else:
            response.headers[name] = value
    return response
