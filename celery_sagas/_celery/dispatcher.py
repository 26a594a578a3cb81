"""CeleryDispatcher: the Dispatcher port over ``apply_async`` (task id = effect id)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from .._definitions import Registry
from .._records import StepRecord
from .tasks import SAGA_REF, saga_ref

__all__ = ["ADVANCE_TASK", "SWEEP_TASK", "CeleryDispatcher"]

ADVANCE_TASK = "celery_sagas.advance"
SWEEP_TASK = "celery_sagas.sweep"


class CeleryDispatcher:
    """Sends steps, compensators and advance requests through the app's broker."""

    def __init__(self, app: Celery, registry: Registry, queue: str | None) -> None:
        self.app = app
        self.registry = registry
        self.queue = queue

    def _send(self, task_name: str, task_id: str, saga_id: str, step: str) -> None:
        kwargs = {SAGA_REF: saga_ref(saga_id, step)}
        task = self.app.tasks.get(task_name)
        if task is not None:
            task.apply_async(args=(), kwargs=kwargs, task_id=task_id)
        else:
            self.app.send_task(task_name, args=(), kwargs=kwargs, task_id=task_id)

    def send_step(self, saga_id: str, step: StepRecord) -> None:
        """Send the step's own task; its task id is the step's effect id."""
        self._send(step.task, step.effect_id, saga_id, step.name)

    def send_compensation(self, saga_id: str, step: StepRecord) -> None:
        """Send the step's compensator; its task id is the compensation effect id."""
        if step.compensator is None:
            raise LookupError(f"step {step.name!r} has no compensator")
        self._send(step.compensator, step.compensation_effect_id, saga_id, step.name)

    def send_advance(self, saga_id: str) -> None:
        """Ask a worker to advance the saga."""
        options: dict[str, Any] = {"queue": self.queue} if self.queue else {}
        self.app.send_task(ADVANCE_TASK, args=(saga_id,), **options)
