"""What a request handler reaches: the app's source, who is asking, and the error page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from flask import current_app, g, render_template

from ._auth import Authenticate, CsrfTokens, Principal
from ._source import SagaSource
from ._throttle import LoginThrottle

__all__ = ["EXTENSION", "Guard", "Web", "page_error", "principal", "source", "web"]

EXTENSION = "celery_sagas.web"


@dataclass(frozen=True, slots=True)
class Guard:
    """How an app lets requests in: who, from which hosts, with which tokens (``_guard``)."""

    authenticate: Authenticate
    challenge: str | None
    csrf: CsrfTokens
    throttle: LoginThrottle
    allowed_hosts: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Web:
    """What one app holds: its data source and how it lets requests in."""

    source: SagaSource
    guard: Guard


def web() -> Web:
    """The state of the app serving this request."""
    return cast(Web, current_app.extensions[EXTENSION])


def source() -> SagaSource:
    """The data source of the app serving this request."""
    return web().source


def principal() -> Principal:
    """Who sent this request (set once authentication passed)."""
    return cast(Principal, g.principal)


def page_error(status: int, message: str) -> tuple[str, int]:
    """The error page; the message is escaped like everything else."""
    return render_template("refused.html", status=status, message=message), status
