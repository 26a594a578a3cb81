"""Celery task base classes for steps and compensators (the message format: ``messages.py``).

A step or compensator task delivers its saga message through a ``Delivery`` of the engine it
is handed (``engines``, a task option: this process's engine, opened after a fork), inside
the runtime's middlewares' ``around_delivery`` (docs/design.md §1.1). Without the
``_saga`` reference its body never runs: there would be no claim and no effect id. Called
directly it raises ``SagaUsageError``; a message sent with ``.delay()`` outside a saga is
rejected by the worker (logged, not requeued). ``task.run`` is the plain function, for unit
tests of a body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from celery import Task
from celery.exceptions import Reject

from .._context import StepContext, signature_of, step_accepts
from .._delivery import Delivery
from .._middleware import Delivering
from .._protocol import codes
from ..errors import SagaConfigurationError, SagaUsageError, StepNotCommitted
from .inline import CeleryInline, body_time_limit, first_budget, hard_limit
from .messages import SAGA_REF, parse_ref
from .wiring import Runtime

__all__ = ["CompensatorTask", "EngineSource", "SagaStepTask"]

logger = logging.getLogger("celery_sagas.execution")


class EngineSource(Protocol):
    """Where a task finds this process's runtime: its deliveries' parts and its middlewares."""

    @property
    def current(self) -> Runtime:
        """This process's runtime (built lazily, and again after a fork)."""
        ...


# What a saga task relies on; Celery applies task_annotations after the class is made.
_GUARDED: dict[str, object] = {"acks_late": True, "reject_on_worker_lost": True, "serializer": "json"}


class _SagaTaskBase(Task):  # type: ignore[misc]
    """Shared settings: late ack, requeue on worker loss, JSON only, no result stored."""

    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    serializer = "json"
    ignore_result = True
    # The reserved ``_saga`` keyword is not in the function's signature; apply_async's
    # argument check would refuse it.
    typing = False
    engines: ClassVar[EngineSource | None] = None  # set per task by ``app.task(engines=...)``
    role: ClassVar[str] = "saga task"
    compensation: ClassVar[bool] = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ref = kwargs.pop(SAGA_REF, None)
        if ref is None:
            raise self._outside_a_saga()
        if self.engines is None:
            raise SagaConfigurationError(f"task {self.name!r} is not bound to a Sagas instance")
        runtime = self.engines.current
        delivery = self._delivery(runtime, ref)
        delivering = Delivering(delivery.saga_id, delivery.step, delivery.effect_id,
                                self.compensation, self.request)
        with runtime.middlewares.around_delivery(delivering):
            self._deliver(delivery)
        return None

    def _deliver(self, delivery: Delivery) -> None:
        """Run the body of this task's kind through ``delivery``."""
        raise NotImplementedError

    @classmethod
    def annotate(cls) -> None:
        """Apply the app's ``task_annotations``, refusing any that would weaken a saga task."""
        super().annotate()
        weakened = sorted(name for name, value in _GUARDED.items() if getattr(cls, name) != value)
        if weakened:
            raise SagaConfigurationError(
                f"task_annotations change {', '.join(weakened)} of saga task {cls.name!r}; saga "
                "tasks need acks_late=True, reject_on_worker_lost=True and serializer='json'"
            )

    def _outside_a_saga(self) -> Exception:
        """What to raise when the task is used without its saga reference."""
        error = SagaUsageError(
            f"{self.name!r} is a {self.role}: it runs only inside a saga (ctx.step in a "
            "@sagas.saga run function), never called directly or sent with .delay(); "
            "call .run(...) to test its body"
        )
        request = self.request
        if request.called_directly or request.is_eager:
            return error
        logger.error("task %s (id %s) arrived without saga context; rejected, body not run",
                     self.name, request.id)
        rejected: Exception = Reject(error, requeue=False)
        return rejected

    def _delivery(self, runtime: Runtime, ref: object) -> Delivery:
        parsed = parse_ref(ref)
        parts = runtime.deliveries
        compensation = self.compensation
        runner = None
        if not compensation:
            budget = getattr(self.request, "inline_budget", None) or first_budget(
                self, parts.settings.inline_max_steps, parts.settings.inline_max_seconds)
            runner = CeleryInline(self, parts.registry, budget)
        hard = hard_limit(self)
        return Delivery(parts, parsed.saga_id, parsed.step, self.request.id,
                        parsed.version, compensation=compensation, inline=runner,
                        time_limit_ms=None if hard is None else int(hard * 1000))

    def _own_time_limit(self) -> float | None:
        """The step's own limit (s) where the task's hard limit is wider (an inline saga's
        step, docs/design.md §3.2): enforced on the body here; None where Celery's is it."""
        if self.engines is None:
            return None
        own_ms = self.engines.current.deliveries.registry.steps.get(self.name)
        limit = own_ms.time_limit_ms if own_ms is not None else None
        hard = hard_limit(self)
        if limit is None or hard is None or hard <= limit / 1000 + 0.5:
            return None
        return limit / 1000

    def _body_kwargs(self, kwargs: Mapping[str, Any], ctx: StepContext, **extra: Any) -> dict[str, Any]:
        merged = dict(kwargs)
        if step_accepts(self.run, "saga"):
            merged["saga"] = ctx
        for key, value in extra.items():
            if step_accepts(self.run, key):
                merged[key] = value
        return merged


class SagaStepTask(_SagaTaskBase):
    """Base class of tasks made by ``sagas.step``."""

    abstract = True
    role = "saga step"

    def _deliver(self, delivery: Delivery) -> None:
        """Run the step's body (within its own time limit, where Celery's is wider)."""
        own_limit = self._own_time_limit()

        def body(ctx: StepContext, step_args: tuple[Any, ...], step_kwargs: Mapping[str, Any]) -> Any:
            call_kwargs = self._body_kwargs(step_kwargs, ctx)
            _refuse_unbindable(self.run, step_args, call_kwargs)
            with body_time_limit(own_limit):
                return self.run(*step_args, **call_kwargs)

        delivery.run_step(body)


def _refuse_unbindable(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
                       ) -> None:
    """Arguments recorded for a function that no longer takes them never reach its body (a
    deploy changed it): the step provably did not begin, so it did not commit."""
    signature = signature_of(func)
    if signature is None:
        return  # nothing to check against; calling it will tell
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        raise StepNotCommitted(codes.ARGUMENTS_MISMATCH) from None


class CompensatorTask(_SagaTaskBase):
    """Base class of tasks made by ``sagas.compensator``."""

    abstract = True
    role = "compensator"
    compensation = True

    def _deliver(self, delivery: Delivery) -> None:
        """Run the compensator's body, handed the step's result."""

        def body(
            ctx: StepContext, step_args: tuple[Any, ...], step_kwargs: Mapping[str, Any], result: Any
        ) -> Any:
            return self.run(*step_args, **self._body_kwargs(step_kwargs, ctx, result=result))

        delivery.run_compensation(body)
