"""The dispatch port: how the engine sends work (a recording one for tests is in
``celery_sagas.testing.dispatcher``)."""

from __future__ import annotations

from typing import Protocol

from ._records import StepRecord

__all__ = ["Dispatcher"]


class Dispatcher(Protocol):
    """Sends saga work to workers; each message carries ids only, never payloads.

    ``version`` is the saga record's version once the intent of that work was written: the
    delivery claims on it without reading the record first (docs/design.md §3.2).
    ``trace_parent`` is the saga's stored W3C traceparent (``SagaRecord.trace_parent``), for a
    message sent where the saga's trace context is not current (a sweep, an operator).
    ``time_limit_s`` is the hard time limit of this message when it is not the task's own: a
    step of an inline saga gets room for the chain of inline steps it may run (§3.2).
    """

    def send_step(self, saga_id: str, step: StepRecord, version: int, *,
                  trace_parent: str | None = None, time_limit_s: float | None = None) -> None:
        """Send the step's task with task id = the step's effect id."""
        ...

    def send_compensation(self, saga_id: str, step: StepRecord, version: int, *,
                          trace_parent: str | None = None) -> None:
        """Send the step's compensator with task id = its compensation effect id."""
        ...
