"""What every request passes before a page or an action runs (``create_app``'s before-request).

In order: the host must be one of ``allowed_hosts`` (when given); the client must not be
throttled for failed logins (``_throttle``); it must authenticate; a POST must come from an
operator, from a page of this app (its ``Origin``, or failing that its ``Referer``, names this
app's origin: a form posted from another site is refused even with the operator's cached
credentials) and carry a CSRF token of its session (``_auth.CsrfTokens``). Everything refused
is logged without a byte of the request that was not validated first.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlsplit

from flask import Response, g, request

from ._auth import SESSION_COOKIE, Principal, new_session, session_id
from ._events import OperatorAction, loggable
from ._request import Guard, page_error, web

__all__ = ["action_name", "after", "csrf_token", "gate"]

logger = logging.getLogger("celery_sagas.web")

_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def gate() -> Any:
    """The before-request check; a response refuses the request, None lets it through."""
    guard = web().guard
    if guard.allowed_hosts is not None and _host() not in guard.allowed_hosts:
        logger.warning("web: request for a host not allowed: %s", loggable(request.host))
        return Response("host not allowed\n", 400, mimetype="text/plain")
    who = _authenticated(guard)
    if isinstance(who, Response):
        return who
    g.principal = who
    g.session = session_id(request.cookies.get(SESSION_COOKIE))
    if request.method in _SAFE_METHODS:
        return None
    return _check_post(guard, who)


def _host() -> str:
    host = request.host.lower()
    return host.rsplit(":", 1)[0] if not host.endswith("]") else host


def _authenticated(guard: Guard) -> Principal | Response:
    given = request.authorization
    name = given.username if given is not None and given.type == "basic" else None
    address = request.remote_addr
    now = time.monotonic()
    wait = guard.throttle.retry_after(name, address, now)
    if wait:
        logger.warning("web: login of user %s from %s throttled", loggable(name), address)
        return Response("too many failed logins: try again later\n", 429, mimetype="text/plain",
                        headers={"Retry-After": str(wait)})
    who = guard.authenticate(request)
    if who is not None:
        return who
    if given is not None:
        guard.throttle.failed(name, address, now)
        logger.warning("web: failed login of user %s from %s", loggable(name), address)
    response = Response("authentication required\n", 401, mimetype="text/plain")
    if guard.challenge:
        response.headers["WWW-Authenticate"] = guard.challenge
    return response


def _check_post(guard: Guard, who: Principal) -> Any:
    if not who.can_act:
        _refuse(who, "read-only")
        return page_error(403, "Read-only users cannot act.")
    if not _same_origin():
        _refuse(who, "origin")
        return page_error(403, "This form was not sent from a page of this app.")
    if not guard.csrf.valid(who, g.session, request.form.get("csrf_token"), int(time.time())):
        _refuse(who, "csrf")
        return page_error(403, "Missing, expired or wrong CSRF token: reload the page and try again.")
    return None


def _same_origin() -> bool:
    """True when the POST names this app's origin in ``Origin`` (or, where a browser sends
    ``Origin: null`` or none, in ``Referer``)."""
    own = f"{request.scheme}://{request.host}".lower()
    origin = request.headers.get("Origin")
    if origin and origin != "null":
        return origin.lower() == own
    referer = request.headers.get("Referer")
    if not referer:
        return False
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}".lower() == own


def _refuse(who: Principal, why: str) -> None:
    """Announce an action refused before it ran (read-only, foreign origin, CSRF)."""
    web().source.announce(OperatorAction.of(action_name(), who, request.form.get("saga_id"),
                                            request.form.get("approval_id"), why))


def action_name() -> str:
    """The action a POST asks for: the name of the route it matched, never the URL's text."""
    endpoint = request.endpoint or ""
    return endpoint.rsplit(".", 1)[-1] if endpoint.startswith("actions.") else "unknown"


def after(response: Response) -> Response:
    """Give an operator's browser a session if it has none, and a new one after every action
    (rotation: the forms of earlier pages no longer post)."""
    who: Principal | None = g.get("principal")
    if who is None or not who.can_act:
        return response
    acted = request.method not in _SAFE_METHODS and response.status_code == 303
    if acted or g.get("new_session") or g.get("session") is None:
        session = new_session() if acted or g.get("session") is None else g.session
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="Strict",
                            secure=request.is_secure, path="/")
    return response


def csrf_token() -> str:
    """The CSRF token for the forms of the page being rendered (a session is made if none)."""
    who: Principal | None = g.get("principal")
    if who is None or not who.can_act:
        return ""
    if g.get("session") is None:
        g.session = new_session()
        g.new_session = True
    return web().guard.csrf.token_for(who, g.session, int(time.time()))
