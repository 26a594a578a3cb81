"""The operator web UI: ``create_app(sagas)`` is a WSGI (Flask) app; ``celery sagas web`` serves it.

Server-rendered pages (overview, sagas, one saga, needs attention) with every value escaped,
SVG drawings rendered on the server, one stylesheet, no script and nothing from a CDN. Every
page needs authentication; actions need the operator role and a CSRF token, and go through the
same facade calls as the CLI; each is logged and handed, as an ``OperatorAction`` naming who
took it, to the ``on_action`` observers. Needs Flask (the ``web`` extra).
"""

from __future__ import annotations

from ._app import create_app
from ._auth import Principal, WebUser, parse_users
from ._events import OperatorAction
from ._serve import serve

__all__ = ["OperatorAction", "Principal", "WebUser", "create_app", "parse_users", "serve"]
