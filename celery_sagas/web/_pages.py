"""The four pages: overview, sagas, one saga, and what needs attention."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, render_template, request

from ._attention import STALE_READ, waits_of
from ._chart import chart
from ._history_view import history_timeline
from ._request import page_error, source
from ._source import ORDERS, PREFIX_READ, STATES, SagaFilter
from ._timeline import timeline
from ._views import (
    child_of,
    deadline_of,
    effect_rows,
    finding_forms,
    hint,
    lifecycle,
    next_attempt,
    outcomes,
    raised,
    resolution,
    saga_actions,
)

__all__ = ["blueprint"]

blueprint = Blueprint("pages", __name__)
PAGE_SIZE = 50
UNDOING = ("compensating", "compensated", "compensation-failed")
QUEUE_SIZE = 25
QUEUE_KINDS = ("manual-review", "ambiguous-execution", "ambiguous-compensation", "stale", "corrupt")


@blueprint.get("/")
def overview() -> str:
    """Sagas by state and definition, what waits for an operator, recent finishes."""
    data = source().overview()
    return render_template("overview.html", overview=data, chart=chart(data.finishes),
                           states=[str(s) for s in STATES], stale_read=STALE_READ)


@blueprint.get("/sagas")
def sagas() -> str:
    """One page of sagas, filtered by state, definition, id prefix, error code and time, in
    index order or sorted by last write."""
    args = request.args
    chosen = SagaFilter.of(args.getlist("state"), args.get("definition") or None,
                           args.get("id") or None, args.get("error") or None,
                           args.get("before") or None, args.get("sort") or None)
    page = source().page(chosen, args.get("cursor") or None, limit=PAGE_SIZE)
    return render_template("sagas.html", page=page, chosen=chosen,
                           states=[str(s) for s in STATES],
                           definitions=source().definitions(), prefix_read=PREFIX_READ,
                           orders=ORDERS,
                           before=_local(chosen.updated_before_ms))


def _local(ms: int | None) -> str:
    """The value of a ``datetime-local`` input for epoch milliseconds (UTC), or empty."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


@blueprint.get("/saga")
def saga() -> str | tuple[str, int]:
    """One saga: its timeline, steps, approvals, payloads and lifecycle events."""
    saga_id = request.args.get("id", "")
    data = source()
    record = data.saga(saga_id)
    if record is None:
        return page_error(404, f"Not found: no saga {saga_id!r}")
    return render_template(
        "saga.html", record=record, timeline=(history_timeline if record.history else timeline)(
            record, data.now_ms()), history=record.history, folded=record.history_folded,
        approvals=data.approvals_of(record), events=lifecycle(record), effects=effect_rows,
        payload=data.payload, resolution=resolution, outcomes=outcomes,
        actions=saga_actions(record), undoing=UNDOING, raised=raised, child_of=child_of,
        deadline_of=deadline_of, next_attempt=next_attempt, waits=waits_of(record),
        children=[child for step in record.steps if (child := child_of(step)) is not None],
    )


@blueprint.get("/attention")
def attention() -> str:
    """The findings queue and the approvals waiting for a decision, each with its forms."""
    args = request.args
    data = source()
    kind = args.get("kind") or None
    findings = data.findings(args.get("cursor") or None, limit=QUEUE_SIZE, kind=kind)
    approvals = data.approvals_waiting(args.get("approvals") or None, limit=QUEUE_SIZE)
    return render_template("attention.html", findings=findings, approvals=approvals, hint=hint,
                           forms=finding_forms, outcomes=outcomes, kind=kind, kinds=QUEUE_KINDS,
                           waiting=data.waiting(QUEUE_SIZE), now_ms=data.now_ms())
