"""The actions, one POST each: resolve, resume, cancel, approve, deny, signal.

Authentication, the operator role, the origin and the CSRF token are checked before any of
these runs (``_guard.gate``). Resolve, cancel and deny change what cannot be taken back: their
first POST only renders a confirmation page holding the same fields, whose button posts them
again with ``confirmed=yes`` (no script). Each goes through the adapter to the same facade
call as the CLI, with the same refusals (rendered by the app's error handler), then redirects
(303) to the saga's page, or back to the queue when the form came from there.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from celery_sagas.errors import SagaValidationError

from ._request import principal, source

__all__ = ["blueprint"]

blueprint = Blueprint("actions", __name__, url_prefix="/actions")
_OUTCOMES = ("committed", "not-committed", "compensated", "not-compensated")


def _field(name: str) -> str:
    value = request.form.get(name, "").strip()
    if not value:
        raise SagaValidationError(f"the form needs {name.replace('_', ' ')}")
    return value


def _json(name: str) -> Any:
    text = request.form.get(name, "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise SagaValidationError(f"{name} is not JSON") from None


_CONFIRM = {
    "resolve": "Record this outcome",
    "cancel": "Cancel the saga and compensate",
    "deny": "Deny this approval",
}


def _unconfirmed(action: str, summary: list[tuple[str, str]]) -> str | None:
    """The confirmation page of ``action`` unless the form was confirmed (None then)."""
    if request.form.get("confirmed") == "yes":
        return None
    fields = [(k, v) for k, v in request.form.items(multi=True)
              if k not in ("csrf_token", "confirmed", "do", "reason")]
    return render_template("confirm.html", action=action, label=_CONFIRM[action],
                           summary=summary, fields=fields)


def _reason() -> str | None:
    """The reason the operator gave (recorded in the saga's history), or None."""
    return request.form.get("reason", "").strip() or None


def _back(saga_id: str | None, done: str) -> Response:
    if request.form.get("back") == "attention" or saga_id is None:
        return redirect(url_for("pages.attention", done=done), 303)
    return redirect(url_for("pages.saga", id=saga_id, done=done), 303)


@blueprint.post("/resolve")
def resolve() -> Response | str:
    """Record what the provider says about an unknown outcome (after a confirmation page)."""
    saga_id = _field("saga_id")
    outcome = request.form.get("outcome", "").strip()
    if outcome not in _OUTCOMES:
        raise SagaValidationError(f"choose the outcome: one of {', '.join(_OUTCOMES)}")
    result = _json("result") if outcome == "committed" else None
    error_code = None
    if outcome == "not-committed":
        error_code = request.form.get("error_code", "").strip() or "not_committed"
    page = _unconfirmed("resolve", [("saga", saga_id), ("step", _field("step")),
                                    ("effect id", _field("effect_id")), ("outcome", outcome),
                                    *([("error code", error_code)] if error_code else [])])
    if page is not None:
        return page
    source().resolve(principal(), saga_id, _field("step"), _field("effect_id"), outcome,
                     result=result, error_code=error_code, reason=_reason())
    return _back(saga_id, "resolve")


@blueprint.post("/resume")
def resume() -> Response:
    """Lift manual review and drive the saga on."""
    saga_id = _field("saga_id")
    source().resume(principal(), saga_id, _reason())
    return _back(saga_id, "resume")


@blueprint.post("/cancel")
def cancel() -> Response | str:
    """Stop the saga and compensate what committed (after a confirmation page)."""
    saga_id = _field("saga_id")
    page = _unconfirmed("cancel", [("saga", saga_id)])
    if page is not None:
        return page
    source().cancel(principal(), saga_id, _reason())
    return _back(saga_id, "cancel")


@blueprint.post("/approve")
def approve() -> Response:
    """Approve a pending approval."""
    decided = source().approve(principal(), _field("approval_id"), _reason())
    return _back(decided.saga_id, "approve")


@blueprint.post("/deny")
def deny() -> Response | str:
    """Deny a pending approval (after a confirmation page)."""
    page = _unconfirmed("deny", [("approval", _field("approval_id"))])
    if page is not None:
        return page
    decided = source().deny(principal(), _field("approval_id"), _reason())
    return _back(decided.saga_id, "deny")


@blueprint.post("/signal")
def signal() -> Response:
    """Send a signal to a saga (where the facade has signals)."""
    saga_id = _field("saga_id")
    signal_id = request.form.get("signal_id", "").strip() or None
    source().signal(principal(), saga_id, _field("name"), _json("payload"), signal_id)
    return _back(saga_id, "signal")
