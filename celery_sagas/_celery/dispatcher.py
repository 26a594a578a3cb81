"""CeleryDispatcher: the Dispatcher port over ``apply_async`` (task id = effect id)."""

from __future__ import annotations

from celery import Celery

from .._records import StepRecord
from .messages import SAGA_REF, saga_ref

__all__ = ["CeleryDispatcher"]


class CeleryDispatcher:
    """Sends steps and compensators through the app's broker."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def _send(self, task_name: str, task_id: str, saga_id: str, step: str, version: int) -> None:
        kwargs = {SAGA_REF: saga_ref(saga_id, step, version)}
        task = self.app.tasks.get(task_name)
        if task is not None:
            task.apply_async(args=(), kwargs=kwargs, task_id=task_id)
        else:
            self.app.send_task(task_name, args=(), kwargs=kwargs, task_id=task_id)

    def send_step(self, saga_id: str, step: StepRecord, version: int) -> None:
        """Send the step's own task; its task id is the step's effect id."""
        self._send(step.task, step.effect_id, saga_id, step.name, version)

    def send_compensation(self, saga_id: str, step: StepRecord, version: int) -> None:
        """Send the step's compensator; its task id is the compensation effect id."""
        if step.compensator is None:
            raise LookupError(f"step {step.name!r} has no compensator")
        self._send(step.compensator, step.compensation_effect_id, saga_id, step.name, version)
