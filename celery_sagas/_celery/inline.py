"""Running a saga's next step inside the task that settled the step before it (docs/design.md
§3.2): the Celery side of ``_inline.py``.

A step runs inline when its saga chose it (``@sagas.saga(inline=True)`` or
``sagas_inline_steps``) and the step did not opt out (``@sagas.step(inline=False)``), and only
where the broker would have delivered it to this very worker: the same queue as the task
running now, no rate limit, the prefork pool's main thread. A chain of inline steps is bounded
by ``sagas_inline_max_steps`` and ``sagas_inline_max_seconds``, and each step's own time limit
must fit in what is left of the running task's hard limit: so that an inline chain fits, a
step of an inline saga is sent with a hard limit of its own limit plus
``sagas_inline_max_seconds`` (``Engine._inline_room``), and each body's own limit is enforced
here, with ``SIGALRM``, as Celery enforces a soft limit (the body sees
``StepTimeLimitExceeded``; its outcome is unknown, code ``time_limit``).

The inline step runs through its task's ``__call__`` with its own request (task id = its effect
id): its delivery, tracing span, logs and Celery's ``task_prerun``, ``task_postrun``,
``task_success`` and ``task_failure`` signals are those of a sent step. The worker events
``task-received`` and ``task-started`` are not sent (no message arrived).
"""

from __future__ import annotations

import logging
import mmap
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task
from celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_success,
    worker_init,
    worker_shutting_down,
)
from celery.worker import state as worker_state

from .. import _values as values
from .._definitions import Registry
from .._inline import InlineBudget
from .._records import SagaRecord, StepRecord
from ..errors import StepTimeLimitExceeded
from .messages import SAGA_REF, saga_ref

__all__ = ["CeleryInline", "body_time_limit", "first_budget", "hard_limit", "stopping"]

logger = logging.getLogger("celery_sagas.execution")

_MARGIN_S = 1.0  # kept free of the running task's hard limit

# One byte shared with the pool processes the worker forks: set by the main process when a
# shutdown begins (``worker_shutting_down`` is sent there only), read by an inline chain in a
# pool process before it claims its next step (docs/design.md §3.2). Each worker makes its own
# when it starts (``worker_init``, in the main process before the pool forks): a byte made at
# import would be shared by every worker forked from one process that imported this module, and
# the first of them to stop would stop the inline chains of all.
_SHUTDOWN = mmap.mmap(-1, 1)


def _worker_starting(**_: Any) -> None:
    global _SHUTDOWN
    _SHUTDOWN = mmap.mmap(-1, 1)


def _shutting_down(**_: Any) -> None:
    _SHUTDOWN[0] = 1


worker_init.connect(_worker_starting, weak=False, dispatch_uid="celery_sagas.inline_start")
worker_shutting_down.connect(_shutting_down, weak=False, dispatch_uid="celery_sagas.inline_stop")


def stopping() -> bool:
    """Whether this worker is shutting down (warm or cold): seen by the main process's signal
    handler, or in this process by Celery's own flags (the solo pool)."""
    flags = (worker_state.should_stop, worker_state.should_terminate)
    return _SHUTDOWN[0] == 1 or any(f is not None and f is not False for f in flags)


def first_budget(task: Task, max_steps: int, max_seconds: float) -> InlineBudget:
    """The budget of a chain started by a task the broker delivered (now)."""
    now = time.monotonic()
    hard = hard_limit(task)
    return InlineBudget(max_steps, now + max_seconds, None if hard is None else now + hard - _MARGIN_S)


def hard_limit(task: Task) -> float | None:
    """The hard time limit (s) Celery enforces on the task running now, if any."""
    limits = getattr(task.request, "timelimit", None) or (None, None)
    hard = limits[0] if limits[0] is not None else task.time_limit
    return float(hard) if hard else None


class CeleryInline:
    """An ``InlineRunner`` for the task running now (``task``) with what is left of its budget."""

    def __init__(self, task: Task, registry: Registry, budget: InlineBudget) -> None:
        self.task = task
        self.registry = registry
        self.budget = budget

    def eligible(self, saga: SagaRecord, step: StepRecord) -> bool:
        """Same queue, no rate limit, the pool's main thread, the budget allows it, and the
        worker is not shutting down (then the step goes through the broker, to a worker that
        stays)."""
        following = self.task.app.tasks.get(step.task)
        if following is None or threading.current_thread() is not threading.main_thread():
            return False
        if stopping():
            logger.info("saga %s: the worker is shutting down; step %s is sent through the "
                        "broker", saga.saga_id, values.printable(step.name))
            return False
        if following.rate_limit or self.task.app.conf.task_default_rate_limit:
            return False
        if self._queue_of(following) != self._queue_now():
            return False
        own = self.registry.step(step.task).time_limit_ms
        return own is not None and self.budget.allows(own)

    def run(self, saga: SagaRecord, step: StepRecord) -> None:
        """Run ``step``'s task here, with its own request, signals and span."""
        following: Task = self.task.app.tasks[step.task]
        kwargs = {SAGA_REF: saga_ref(saga.saga_id, step.name, saga.version)}
        outer = self.task.request
        following.push_request(
            id=step.effect_id, args=(), kwargs=kwargs, delivery_info=outer.delivery_info,
            hostname=outer.hostname, timelimit=outer.timelimit, headers=outer.headers,
            called_directly=False, is_eager=False, inline_budget=self.budget.spent(),
        )
        task_prerun.send(sender=following, task_id=step.effect_id, task=following, args=(),
                         kwargs=kwargs)
        retval: Any = None
        state = "SUCCESS"
        try:
            retval = following(**kwargs)
        except Exception as exc:
            state = "FAILURE"
            task_failure.send(sender=following, task_id=step.effect_id, exception=exc, args=(),
                              kwargs=kwargs, traceback=exc.__traceback__, einfo=None)
            raise
        else:
            task_success.send(sender=following, result=retval)
        finally:
            task_postrun.send(sender=following, task_id=step.effect_id, task=following, args=(),
                              kwargs=kwargs, retval=retval, state=state)
            following.pop_request()

    def _queue_now(self) -> str | None:
        info = self.task.request.delivery_info or {}
        queue = info.get("routing_key")
        return str(queue) if queue else None

    def _queue_of(self, task: Task) -> str | None:
        route = self.task.app.amqp.router.route({}, task.name, (), {})
        queue = route.get("queue")
        name = getattr(queue, "name", queue)
        return str(name) if name else None


@contextmanager
def body_time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``StepTimeLimitExceeded`` in the body past ``seconds`` (main thread only)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise StepTimeLimitExceeded(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
