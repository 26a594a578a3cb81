"""The Celery integration: the only package (with the CLI) that imports celery."""

from __future__ import annotations

from .facade import Saga, SagaHandle, Sagas
from .periodic import SagaSchedule

__all__ = ["Saga", "SagaHandle", "SagaSchedule", "Sagas"]
