"""The names and the one message format saga tasks use (docs/design.md §3.2, §8).

A saga delivers a step as the step's own Celery task, with ``task_id`` = the effect id and a
single reserved keyword argument, ``_saga`` = ``{"id": saga_id, "step": step_name, "v":
version}``: the saga record's version once the step's intent was written, which the delivery
claims on without reading first. Arguments stay in the saga store, never in the broker.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery.signals import before_task_publish

from .. import _values as values
from ..errors import SagaConfigurationError, SagaValidationError

__all__ = ["PERIODIC_TASK", "SAGA_REF", "SENT_AT", "SWEEP_TASK", "SagaRef", "parse_ref", "saga_ref",
           "sent_at", "stamp_sent_at"]

SAGA_REF = "_saga"
SWEEP_TASK = "celery_sagas.sweep"
PERIODIC_TASK = "celery_sagas.periodic"
SENT_AT = "saga_sent_at_ms"  # header: when a tick or a sweep was published (ms since the epoch)


@dataclass(frozen=True, slots=True)
class SagaRef:
    """What a saga task message names: the saga, the step, and the version to claim on."""

    saga_id: str
    step: str
    version: int | None


def saga_ref(saga_id: str, step: str, version: int | None = None) -> dict[str, Any]:
    """The reserved keyword argument a saga message carries."""
    ref: dict[str, Any] = {"id": saga_id, "step": step}
    if version is not None:
        ref["v"] = version
    return ref


def parse_ref(ref: object) -> SagaRef:
    """Read the reserved keyword argument; SagaConfigurationError when it is malformed."""
    if not isinstance(ref, Mapping):
        raise SagaConfigurationError("malformed saga reference in the task message")
    saga_id, step, version = ref.get("id"), ref.get("step"), ref.get("v")
    if not isinstance(saga_id, str) or not isinstance(step, str):
        raise SagaConfigurationError("malformed saga reference in the task message")
    if version is not None and (type(version) is not int or version < 1):
        raise SagaConfigurationError("malformed saga reference in the task message")
    return SagaRef(saga_id, step, version)


def stamp_sent_at() -> None:
    """Stamp every tick and sweep this process publishes with its send time (once per process)."""
    before_task_publish.connect(_stamp, weak=False, dispatch_uid="celery_sagas.sent_at")


def _stamp(sender: object = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Stamp a tick or a sweep with the time it is published (beat: right after it was due)."""
    if sender in (PERIODIC_TASK, SWEEP_TASK) and headers is not None and SENT_AT not in headers:
        headers[SENT_AT] = int(time.time() * 1000)


def sent_at(request: Any) -> int | None:
    """The send time stamped on a task request (ms since the epoch), or None."""
    value = getattr(request, SENT_AT, None)
    if value is None and isinstance(getattr(request, "headers", None), Mapping):
        value = request.headers.get(SENT_AT)
    if type(value) is not int:
        return None
    try:
        return values.timestamp_ms(value)
    except SagaValidationError:
        return None
