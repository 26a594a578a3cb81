"""The names and the one message format saga tasks use (docs/design.md §3.2, §8).

A saga delivers a step as the step's own Celery task, with ``task_id`` = the effect id and a
single reserved keyword argument, ``_saga`` = ``{"id": saga_id, "step": step_name, "v":
version}``: the saga record's version once the step's intent was written, which the delivery
claims on without reading first. Arguments stay in the saga store, never in the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SagaConfigurationError

__all__ = ["PERIODIC_TASK", "SAGA_REF", "SWEEP_TASK", "SagaRef", "parse_ref", "saga_ref"]

SAGA_REF = "_saga"
SWEEP_TASK = "celery_sagas.sweep"
PERIODIC_TASK = "celery_sagas.periodic"


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
