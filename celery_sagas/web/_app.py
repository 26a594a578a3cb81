"""The Flask app factory: authentication on every request, CSRF on every POST, hardening."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, g, request

from celery_sagas.errors import (
    InvalidRecordError,
    SagaConfigurationError,
    SagaError,
    SagaNotFound,
    SagaValidationError,
    StoreError,
)

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
from ._events import ActionObserver, OperatorAction, announcer
from ._request import EXTENSION, Web, page_error, web
from ._source import SagaSource
from ._views import DONE, iso

if TYPE_CHECKING:
    from collections.abc import Iterable

    from celery_sagas import Sagas

__all__ = ["create_app"]

logger = logging.getLogger("celery_sagas.web")

_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_HEADERS = {
    # No script at all; styles and images from this app only; forms post back here only.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_app(sagas: Sagas, *, users: Iterable[WebUser] | None = None,
               authenticate: Authenticate | None = None, secret: bytes | None = None,
               on_action: Iterable[ActionObserver] = ()) -> Flask:
    """The operator UI as a WSGI (Flask) app, to serve or to mount in an existing stack.

    Authentication: HTTP basic with ``users`` (default: from ``CELERY_SAGAS_WEB_USERS`` or
    ``CELERY_SAGAS_WEB_USERS_FILE``), or ``authenticate(request) -> Principal | None`` from the
    mounting app. ``secret`` keys the CSRF tokens (default ``CELERY_SAGAS_WEB_SECRET``, else
    random per process). Every action is logged on ``celery_sagas.web`` and handed, as an
    ``OperatorAction`` naming who took it, to each callable of ``on_action``.
    """
    if users is not None and authenticate is not None:
        raise SagaConfigurationError("pass users= or authenticate= to create_app, not both")
    challenge = None
    if authenticate is None:
        basic = BasicAuth(users_from_environment() if users is None else users)
        authenticate, challenge = basic, basic.challenge
    app = Flask(EXTENSION, static_folder="static", template_folder="templates")
    app.jinja_env.autoescape = True
    app.extensions[EXTENSION] = Web(
        SagaSource(sagas, announcer(on_action)), authenticate, challenge,
        CsrfTokens(secret if secret is not None else secret_from_environment()),
    )
    app.before_request(_gate)
    app.after_request(_harden)
    app.context_processor(_context)
    app.add_template_filter(iso, "iso")
    app.register_blueprint(_pages.blueprint)
    app.register_blueprint(_actions.blueprint)
    app.register_error_handler(SagaError, _refused)
    return app


def _gate() -> Any:
    state = web()
    who = state.authenticate(request)
    if who is None:
        response = Response("authentication required\n", 401, mimetype="text/plain")
        if state.challenge:
            response.headers["WWW-Authenticate"] = state.challenge
        return response
    g.principal = who
    if request.method in _SAFE_METHODS:
        return None
    if not who.can_act:
        _refuse(who, "read-only")
        return page_error(403, "Read-only users cannot act.")
    if not state.csrf.valid(who, request.form.get("csrf_token")):
        _refuse(who, "csrf")
        return page_error(403, "Missing or wrong CSRF token: reload the page and try again.")
    return None


def _refuse(who: Principal, why: str) -> None:
    """Announce an action refused before it ran (read-only user, missing or wrong CSRF token)."""
    action = request.path.rsplit("/", 1)[-1]
    web().source.announce(OperatorAction.of(action, who, request.form.get("saga_id"),
                                            request.form.get("approval_id"), why))


def _harden(response: Response) -> Response:
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _context() -> dict[str, Any]:
    who: Principal | None = g.get("principal")
    state = web()
    return {
        "principal": who,
        "can_act": who is not None and who.can_act,
        "csrf_token": state.csrf.token_for(who) if who is not None and who.can_act else "",
        "can_signal": state.source.can_signal,
        "notice": DONE.get(request.args.get("done", "")),
    }


def _status(exc: SagaError) -> int:
    if isinstance(exc, SagaNotFound):
        return 404
    if isinstance(exc, SagaValidationError):
        return 400
    if isinstance(exc, (StoreError, InvalidRecordError)):
        return 503
    return 409


def _refused(exc: SagaError) -> tuple[str, int]:
    status = _status(exc)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if status == 503:
        logger.error("web: %r failed: %s", request.path, type(exc).__name__)
    what = {400: "Not valid", 404: "Not found", 409: "Refused, nothing changed",
            503: "The store failed"}[status]
    return page_error(status, f"{what}: {first}")
