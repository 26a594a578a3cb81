"""CeleryDispatcher: the Dispatcher port over ``apply_async`` (task id = effect id); each send
runs inside the middlewares' ``around_send``, whose headers the message carries (the saga's
trace context: ``tracing.py``)."""

from __future__ import annotations

from celery import Celery

from .._middleware import Middlewares, Sending
from .._records import StepRecord
from .messages import SAGA_REF, saga_ref

__all__ = ["CeleryDispatcher"]


class CeleryDispatcher:
    """Sends steps and compensators through the app's broker."""

    def __init__(self, app: Celery, middlewares: Middlewares | None = None) -> None:
        self.app = app
        self.middlewares = middlewares if middlewares is not None else Middlewares()

    def _send(self, task_name: str, task_id: str, saga_id: str, step: str, version: int,
              trace_parent: str | None, time_limit_s: float | None = None) -> None:
        kwargs = {SAGA_REF: saga_ref(saga_id, step, version)}
        task = self.app.tasks.get(task_name)
        sending = Sending(saga_id, step, trace_parent)
        with self.middlewares.around_send(sending):
            headers = sending.headers
            options: dict[str, object] = {"headers": headers} if headers else {}
            if time_limit_s is not None:
                options["time_limit"] = time_limit_s
            if task is not None:
                task.apply_async(args=(), kwargs=kwargs, task_id=task_id, **options)
            else:
                self.app.send_task(task_name, args=(), kwargs=kwargs, task_id=task_id, **options)

    def send_step(self, saga_id: str, step: StepRecord, version: int, *,
                  trace_parent: str | None = None, time_limit_s: float | None = None) -> None:
        """Send the step's own task; its task id is the step's effect id."""
        self._send(step.task, step.effect_id, saga_id, step.name, version, trace_parent,
                   time_limit_s)

    def send_compensation(self, saga_id: str, step: StepRecord, version: int, *,
                          trace_parent: str | None = None) -> None:
        """Send the step's compensator; its task id is the compensation effect id."""
        if step.compensator is None:
            raise LookupError(f"step {step.name!r} has no compensator")
        self._send(step.compensator, step.compensation_effect_id, saga_id, step.name, version,
                   trace_parent)
