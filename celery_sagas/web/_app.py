"""The Flask app factory: the request guard (`_guard`), the pages and actions, hardening."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from flask import Flask, Response, g, request
from werkzeug.datastructures import MultiDict

from celery_sagas._error_kinds import ErrorKind, error_kind
from celery_sagas.errors import SagaConfigurationError, SagaError

from . import _actions, _pages
from ._auth import (
    Authenticate,
    BasicAuth,
    CsrfTokens,
    Principal,
    WebUser,
    secret_from_environment,
    users_from_environment,
)
from ._events import ActionObserver, announcer
from ._guard import after, csrf_token, gate
from ._request import EXTENSION, Guard, Web, page_error, web
from ._source import SagaSource
from ._throttle import LoginThrottle
from ._views import DONE, iso

if TYPE_CHECKING:
    from collections.abc import Iterable

    from celery_sagas import Sagas

__all__ = ["HOSTS_ENV", "create_app", "hosts_from_environment"]

logger = logging.getLogger("celery_sagas.web")

HOSTS_ENV = "CELERY_SAGAS_WEB_ALLOWED_HOSTS"
_HEADERS = {
    # No script at all; styles and images from this app only; forms post back here only.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Same-origin form posts carry a Referer (and an Origin other than "null"), which the POST
    # check reads; no other site learns a URL of this app.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def create_app(sagas: Sagas, *, users: Iterable[WebUser] | None = None,
               authenticate: Authenticate | None = None, secret: bytes | None = None,
               on_action: Iterable[ActionObserver] = (),
               allowed_hosts: Iterable[str] | None = None) -> Flask:
    """The operator UI as a WSGI (Flask) app, to serve or to mount in an existing stack.

    Authentication: HTTP basic with ``users`` (default: from ``CELERY_SAGAS_WEB_USERS`` or
    ``CELERY_SAGAS_WEB_USERS_FILE``; failed logins throttled per user and per address), or
    ``authenticate(request) -> Principal | None`` from the mounting app. ``secret`` keys the
    CSRF tokens (default ``CELERY_SAGAS_WEB_SECRET``, else random per process).
    ``allowed_hosts`` (default ``CELERY_SAGAS_WEB_ALLOWED_HOSTS``, comma-separated; unset: any)
    are the host names requests may name. Every action is logged on ``celery_sagas.web`` and
    handed, as an ``OperatorAction`` naming who took it, to each callable of ``on_action``.
    """
    if users is not None and authenticate is not None:
        raise SagaConfigurationError("pass users= or authenticate= to create_app, not both")
    challenge = None
    if authenticate is None:
        basic = BasicAuth(users_from_environment() if users is None else users)
        authenticate, challenge = basic, basic.challenge
    hosts = hosts_from_environment() if allowed_hosts is None else frozenset(
        h.strip().lower() for h in allowed_hosts)
    app = Flask(EXTENSION, static_folder="static", template_folder="templates")
    app.jinja_env.autoescape = True
    guard = Guard(authenticate, challenge,
                  CsrfTokens(secret if secret is not None else secret_from_environment()),
                  LoginThrottle(), hosts)
    app.extensions[EXTENSION] = Web(SagaSource(sagas, announcer(on_action)), guard)
    app.before_request(gate)
    app.after_request(_harden)
    app.context_processor(_context)
    app.add_template_filter(iso, "iso")
    app.register_blueprint(_pages.blueprint)
    app.register_blueprint(_actions.blueprint)
    app.register_error_handler(SagaError, _refused)
    return app


def hosts_from_environment(environ: Mapping[str, str] = os.environ) -> frozenset[str] | None:
    """The host names of ``CELERY_SAGAS_WEB_ALLOWED_HOSTS``, or None (any host) when unset."""
    text = environ.get(HOSTS_ENV, "").strip()
    if not text:
        return None
    return frozenset(h.strip().lower() for h in text.split(",") if h.strip())


def _harden(response: Response) -> Response:
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    return after(response)


def _context() -> dict[str, Any]:
    who: Principal | None = g.get("principal")
    return {
        "principal": who,
        "can_act": who is not None and who.can_act,
        "csrf_token": csrf_token,
        "can_signal": web().source.can_signal,
        "notice": DONE.get(request.args.get("done", "")),
        **_refresh(),
    }


REFRESH_S = ("10", "30", "60")


def _refresh() -> dict[str, Any]:
    """Opt-in auto-refresh with no script: ``?refresh=N`` renders ``<meta http-equiv=refresh>``
    (the CSP stays strict), and links to turn it on or off for the page shown."""
    if request.method != "GET":
        return {"refresh": None, "refresh_on": None, "refresh_off": None}
    chosen = request.args.get("refresh")
    args = MultiDict(request.args)
    args.pop("done", None)
    args.pop("refresh", None)
    off = request.path + ("?" + urlencode(list(args.items(multi=True))) if args else "")
    args["refresh"] = "30"
    return {"refresh": chosen if chosen in REFRESH_S else None,
            "refresh_on": request.path + "?" + urlencode(list(args.items(multi=True))),
            "refresh_off": off}


_STATUSES = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INVALID: 400,
    ErrorKind.MISCONFIGURED: 409,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.REFUSED: 409,
}


def _status(exc: SagaError) -> int:
    return _STATUSES[error_kind(exc)]


def _refused(exc: SagaError) -> tuple[str, int]:
    status = _status(exc)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if status == 503:
        logger.error("web: %r failed: %s", request.path, type(exc).__name__)
    what = {400: "Not valid", 404: "Not found", 409: "Refused, nothing changed",
            503: "The store failed"}[status]
    return page_error(status, f"{what}: {first}")
