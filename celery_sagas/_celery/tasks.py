"""Celery task base classes for steps and compensators, and the message that drives them.

A saga delivers a step as the step's own Celery task, with ``task_id`` = the effect id and a
single reserved keyword argument, ``_saga`` = ``{"id": saga_id, "step": step_name}``. Arguments
stay in the saga store (never in the broker). Called without ``_saga`` (directly, or with
``.delay()`` outside a saga) the task simply runs its function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

from .._context import StepContext, step_accepts
from .._delivery import execute_compensation, execute_step
from .._protocol import codes
from ..errors import SagaConfigurationError, StepNotCommitted

if TYPE_CHECKING:
    from .facade import Sagas

__all__ = ["SAGA_REF", "CompensatorTask", "SagaStepTask", "saga_ref"]

SAGA_REF = "_saga"


def saga_ref(saga_id: str, step: str) -> dict[str, str]:
    """The reserved keyword argument a saga message carries."""
    return {"id": saga_id, "step": step}


def _parse_ref(ref: Any) -> tuple[str, str]:
    if not isinstance(ref, Mapping) or not isinstance(ref.get("id"), str) or not isinstance(
        ref.get("step"), str
    ):
        raise SagaConfigurationError("malformed saga reference in the task message")
    return ref["id"], ref["step"]


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
    sagas: ClassVar[Sagas | None] = None

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

    def _sagas(self) -> Sagas:
        if self.sagas is None:
            raise SagaConfigurationError(f"task {self.name!r} is not bound to a Sagas instance")
        return self.sagas

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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ref = kwargs.pop(SAGA_REF, None)
        if ref is None:
            return self.run(*args, **kwargs)
        saga_id, step = _parse_ref(ref)

        def body(ctx: StepContext, step_args: tuple[Any, ...], step_kwargs: Mapping[str, Any]) -> Any:
            call_kwargs = self._body_kwargs(step_kwargs, ctx)
            _refuse_unbindable(self.run, step_args, call_kwargs)
            return self.run(*step_args, **call_kwargs)

        execute_step(self._sagas().engine, saga_id, step, self.request.id, body)
        return None


def _refuse_unbindable(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
                       ) -> None:
    """Arguments recorded for a function that no longer takes them never reach its body (a
    deploy changed it): the step provably did not begin, so it did not commit."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # nothing to check against; calling it will tell
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        raise StepNotCommitted(codes.ARGUMENTS_MISMATCH) from None


class CompensatorTask(_SagaTaskBase):
    """Base class of tasks made by ``sagas.compensator``."""

    abstract = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ref = kwargs.pop(SAGA_REF, None)
        if ref is None:
            return self.run(*args, **kwargs)
        saga_id, step = _parse_ref(ref)

        def body(
            ctx: StepContext, step_args: tuple[Any, ...], step_kwargs: Mapping[str, Any], result: Any
        ) -> Any:
            return self.run(*step_args, **self._body_kwargs(step_kwargs, ctx, result=result))

        execute_compensation(self._sagas().engine, saga_id, step, self.request.id, body)
        return None
