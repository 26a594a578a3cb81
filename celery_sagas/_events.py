"""Lifecycle and finding events: observers and structured logging (docs/operations.md).

Every effect transition becomes one ``LifecycleEvent``; everything a sweep reports for an
operator (manual review, ambiguity, stale effects, corrupt records) becomes one
``FindingEvent``. They reach the runtime's middleware chain (``_middleware.py``); the
``EventBus`` is its member that logs them with structured ``extra`` fields and hands them to
the observers of ``Sagas.subscribe``; tracing and metrics are members beside it.

Findings travel on their own channel (``subscribe_findings``) rather than as lifecycle events
with stage ``reconciliation``: a finding is a report about a record, not an effect transition,
and it has no phase or attempt. Lifecycle observers therefore see exactly one event per effect move.

Events carry ids, names, states and error codes only; saga input, step arguments, results,
exception messages, free-text reasons and approval tokens never enter them, so neither do
the logs and metrics fed from them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ._middleware import Middleware
from ._protocol.events import LifecycleEvent, Phase, Stage, effect_stage
from ._protocol.findings import Finding
from ._values import printable

__all__ = [
    "EventBus",
    "FindingEvent",
    "FindingObserver",
    "LifecycleEvent",
    "Observer",
    "Phase",
    "Stage",
    "effect_stage",
]

FindingEvent = Finding
"""A finding as observers and logs see it (the same type: ``_protocol/findings.Finding``)."""

logger = logging.getLogger("celery_sagas.events")
findings_logger = logging.getLogger("celery_sagas.findings")


class Observer(Protocol):
    """Receives every lifecycle event; must not raise (errors are logged and ignored)."""

    def __call__(self, event: LifecycleEvent, /) -> None:
        """Handle one event."""
        ...


class FindingObserver(Protocol):
    """Receives every finding a sweep reports; must not raise (errors are logged and ignored)."""

    def __call__(self, event: FindingEvent, /) -> None:
        """Handle one finding."""
        ...


E = TypeVar("E")


class _Channel(Generic[E]):
    """A thread-safe list of observers of one event type."""

    def __init__(self) -> None:
        self._observers: list[Callable[[E], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: Callable[[E], None]) -> Callable[[], None]:
        with self._lock:
            self._observers.append(observer)

        def unsubscribe() -> None:
            with self._lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return unsubscribe

    def deliver(self, event: E) -> None:
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(event)
            except Exception:
                logger.exception("saga observer %r failed", observer)


_LIFECYCLE_LEVELS = {
    Phase.INTENT: logging.DEBUG,
    Phase.EXECUTING: logging.DEBUG,
    Phase.AMBIGUOUS: logging.WARNING,
}


def _finding_level(event: FindingEvent) -> int:
    """ERROR for corrupt records and failed archives, WARNING for what needs an operator now
    (manual review, an effect past every time limit), INFO for work late but still able to
    finish."""
    if event.kind in ("corrupt", "archive_failed"):
        return logging.ERROR
    if event.kind in ("manual-review", "ambiguous") or event.state == "manual-review":
        return logging.WARNING
    return logging.INFO


class EventBus(Middleware):
    """Fans events out to observers and to ``logging`` with structured ``extra`` fields: the
    middleware of events and their logs.

    Lifecycle events log on ``celery_sagas.events`` (intent/executing at DEBUG, committed and
    failed at INFO, ambiguous at WARNING); findings on ``celery_sagas.findings`` (corrupt at
    ERROR; manual review and effects past every time limit at WARNING; stale sagas, steps
    still in flight in a stale saga and incomplete effects at INFO).
    """

    def __init__(self) -> None:
        self._lifecycle: _Channel[LifecycleEvent] = _Channel()
        self._findings: _Channel[FindingEvent] = _Channel()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Register a lifecycle observer; returns a function that unregisters it."""
        return self._lifecycle.subscribe(observer)

    def subscribe_findings(self, observer: FindingObserver) -> Callable[[], None]:
        """Register a finding observer; returns a function that unregisters it."""
        return self._findings.subscribe(observer)

    def emit(self, event: LifecycleEvent) -> None:
        """Deliver a lifecycle event to the log and every lifecycle observer."""
        level = _LIFECYCLE_LEVELS.get(event.phase, logging.INFO)
        if logger.isEnabledFor(level):
            logger.log(
                level,
                "saga %s step %s: %s %s (effect %s, attempt %d, code %s)",
                event.saga_id, event.step, event.stage, event.phase, event.effect_id,
                event.attempt, event.error_code or "-",
                extra=event.log_fields(),
            )
        self._lifecycle.deliver(event)

    def report(self, event: FindingEvent) -> None:
        """Deliver a finding to the log and every finding observer."""
        findings_logger.log(
            _finding_level(event),
            "finding %s: %s %s (%s; step %s, effect %s, code %s)%s",
            event.kind, event.record_kind, printable(event.record_id), event.state or "-",
            event.step or "-", event.effect_id or "-", event.error_code or "-",
            f": {printable(event.cause)}" if event.cause else "",
            extra=event.log_fields(),
        )
        self._findings.deliver(event)

    def on_event(self, event: LifecycleEvent) -> None:
        """A lifecycle event from the chain: log it and hand it to the observers."""
        self.emit(event)

    def on_finding(self, finding: FindingEvent) -> None:
        """A finding from the chain: log it and hand it to the finding observers."""
        self.report(finding)
