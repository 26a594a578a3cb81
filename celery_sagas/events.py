"""Lifecycle events (SPEC §8): observers, structured logging, and metrics hooks.

Every effect transition becomes one ``LifecycleEvent``. Events carry ids, names, states and
error codes only; saga input, step arguments, results and approval tokens never enter them,
so neither do the logs and metrics fed from them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

__all__ = ["EventBus", "LifecycleEvent", "Observer", "Phase", "Stage"]

logger = logging.getLogger("celery_sagas.events")


class Stage:
    """Where an effect happens."""

    EXECUTION = "execution"
    COMPENSATION = "compensation"
    RECONCILIATION = "reconciliation"


class Phase:
    """What happened to the effect."""

    INTENT = "intent"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One effect transition; ids and codes only, never payloads."""

    effect_id: str
    capability: str
    stage: str
    phase: str
    attempt: int
    saga_id: str
    definition: str
    step: str
    error_code: str | None = None
    duration_ms: int | None = None


class Observer(Protocol):
    """Receives every lifecycle event; must not raise (errors are logged and ignored)."""

    def __call__(self, event: LifecycleEvent) -> None:
        """Handle one event."""
        ...


class EventBus:
    """Fans events out to observers and to ``logging`` with structured ``extra`` fields."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Register an observer; returns a function that unregisters it."""
        with self._lock:
            self._observers.append(observer)

        def unsubscribe() -> None:
            with self._lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return unsubscribe

    def emit(self, event: LifecycleEvent) -> None:
        """Deliver an event to the log and every observer."""
        level = logging.WARNING if event.phase == Phase.AMBIGUOUS else logging.INFO
        fields = {f"saga_{k}": v for k, v in asdict(event).items()}
        logger.log(
            level,
            "saga %s %s %s %s (effect %s, attempt %s)",
            event.saga_id,
            event.step,
            event.stage,
            event.phase,
            event.effect_id,
            event.attempt,
            extra=fields,
        )
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(event)
            except Exception:
                logger.exception("saga observer %r failed", observer)
