"""Wake-ups: "look at this saga again at time T", kept in the store's own index.

A retry due later than a delivery can wait for (an idempotent step's backoff) must be sent by
the sweep when it is due, not when the saga happens to look stale. The store indexes records
by (kind, state, updated_at), so a wake-up is a tiny record of kind ``wakeup`` in state
``due`` whose ``updated_at_ms`` is the due time: the sweep's scan with ``updated_before=now``
finds exactly the wake-ups that are due, and its cost follows them alone. A fired wake-up moves
to ``fired`` (never scanned again). Losing a wake-up (a crash before it is written) only delays
the retry until the saga is stale, which the sweep handles anyway.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from . import _values as values
from .errors import InvalidRecordError, SagaValidationError
from .stores.base import Envelope, Fence, Store

__all__ = ["WAKEUP", "Wakeup", "fired", "schedule", "wakeup_from_envelope"]

WAKEUP = "wakeup"
DUE = "due"
FIRED = "fired"


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A due time for one saga."""

    wakeup_id: str
    saga_id: str
    due_at_ms: int
    created_at_ms: int
    version: int = 1


def _wakeup_id(saga_id: str, reason: str) -> str:
    return hashlib.sha256(f"{saga_id}\n{reason}".encode()).hexdigest()[:40]


def schedule(store: Store, saga_id: str, reason: str, due_at_ms: int, now_ms: int) -> Wakeup:
    """Record a wake-up for ``saga_id`` at ``due_at_ms`` (idempotent per saga and reason)."""
    wakeup = Wakeup(_wakeup_id(saga_id, reason), saga_id, max(due_at_ms, now_ms), now_ms)
    body = json.dumps({"saga_id": saga_id, "created_at_ms": now_ms})
    store.create(Envelope(WAKEUP, wakeup.wakeup_id, 1, DUE, wakeup.due_at_ms, body))
    return wakeup


def wakeup_from_envelope(envelope: Envelope) -> Wakeup:
    """Decode a wake-up; anything off is an invalid record."""
    fail = InvalidRecordError(kind=WAKEUP, record_id=envelope.id)
    if type(envelope.version) is not int or envelope.version < 1:
        raise fail
    try:
        body = json.loads(envelope.body)
        saga_id, created = body["saga_id"], body["created_at_ms"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise fail from exc
    if not isinstance(saga_id, str) or type(created) is not int:
        raise fail
    try:
        values.saga_id(saga_id)
    except SagaValidationError:
        raise fail from None
    return Wakeup(envelope.id, saga_id, envelope.updated_at_ms, created, envelope.version)


def fired(store: Store, wakeup: Wakeup, now_ms: int, fence: Fence | None = None) -> bool:
    """Mark a wake-up as fired so no later sweep sees it again (refused under a stale ``fence``)."""
    body = json.dumps({"saga_id": wakeup.saga_id, "created_at_ms": wakeup.created_at_ms})
    done = Envelope(WAKEUP, wakeup.wakeup_id, wakeup.version + 1, FIRED,
                    max(now_ms, wakeup.due_at_ms), body)
    return store.compare_and_set(done, wakeup.version, fence=fence)
