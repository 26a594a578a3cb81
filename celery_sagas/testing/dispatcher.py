"""A dispatcher that records messages instead of sending them: engine tests drive the work by
hand (``SagaDriver`` uses one)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .._records import StepRecord

__all__ = ["RecordingDispatcher", "Sent"]


@dataclass(frozen=True, slots=True)
class Sent:
    """One message a RecordingDispatcher was asked to send."""

    kind: str
    saga_id: str
    step: str
    effect_id: str
    version: int | None = None
    task: str | None = None


class RecordingDispatcher:
    """Keeps every message instead of sending it (engine tests drive the work by hand)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[Sent] = []

    def send_step(self, saga_id: str, step: StepRecord, version: int, *,
                  trace_parent: str | None = None, time_limit_s: float | None = None) -> None:
        """Record a step message."""
        self._add(Sent("step", saga_id, step.name, step.effect_id, version, step.task))

    def send_compensation(self, saga_id: str, step: StepRecord, version: int, *,
                          trace_parent: str | None = None) -> None:
        """Record a compensation message."""
        self._add(Sent("compensation", saga_id, step.name, step.compensation_effect_id, version,
                       step.compensator))

    def take(self) -> list[Sent]:
        """Return and forget every recorded message."""
        with self._lock:
            taken, self.sent = self.sent, []
        return taken

    def _add(self, sent: Sent) -> None:
        with self._lock:
            self.sent.append(sent)
