"""Turning user functions into saga tasks: the checks every ``@sagas.step`` and
``@sagas.compensator`` passes, and the saga definitions' registration (docs/design.md §8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from .. import _values as values
from .._approvals.tokens import TokenSigner
from .._definitions import (
    COMPENSATE_CAPABILITY,
    COMPENSATION_ORDERS,
    COMPENSATOR_OPTIONS,
    EXECUTE_CAPABILITY,
    STEP_OPTIONS,
    CompensatorOptions,
    Registry,
    SagaDefinition,
    SecondsBackoff,
    StepOptions,
    checked_exception_types,
    checked_max_attempts,
    checked_retries,
    seconds_backoff,
)
from ..errors import SagaConfigurationError, SagaValidationError
from .options import refuse_unknown_options
from .tasks import CompensatorTask, EngineSource, SagaStepTask

__all__ = [
    "checked_secrets",
    "refuse_pickle",
    "refuse_pickle_accepted",
    "register_compensator",
    "register_definition",
    "register_step",
]

_REFUSED_OPTIONS = ("autoretry_for", "max_retries", "retry_backoff", "acks_late", "reject_on_worker_lost")
_PICKLE = ("pickle", "application/x-python-serialize")
_MAX_TIME_LIMIT_S = 366 * 24 * 3600  # as the duration settings: past it, "now + limit" means nothing


def _name_of(task: Any) -> str | None:
    if task is None:
        return None
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise SagaConfigurationError("compensate= takes a compensator task or its name")
    return name


def _task_options(app: Celery, fn: Callable[..., Any], options: dict[str, Any],
                  default_time_limit_s: float) -> dict[str, Any]:
    for refused in _REFUSED_OPTIONS:
        if refused in options:
            raise SagaConfigurationError(
                f"{refused} is not allowed on saga tasks: use idempotent=/retries= (retries "
                "and acknowledgement are the saga's job)"
            )
    refuse_pickle(options.get("serializer", "json"))
    options = dict(options)
    options.setdefault("name", app.gen_task_name(fn.__name__, fn.__module__))
    options.setdefault("time_limit", default_time_limit_s)
    for limit in ("time_limit", "soft_time_limit"):  # seconds or a timedelta, as every duration
        if limit in options:
            options[limit] = values.plain_seconds(options[limit])
    _check_time_limit(options["time_limit"])
    options["shared"] = False
    return options


def register_step(app: Celery, registry: Registry, engines: EngineSource, func: Callable[..., Any], *,
                  compensate: Any, idempotent: bool, not_committed_on: tuple[type[BaseException], ...],
                  retries: int | None, backoff: SecondsBackoff | None, capability: str | None,
                  default_time_limit_s: float, task_options: dict[str, Any],
                  retry_on: object = (), compensate_unknown: object = False,
                  inline: object = True) -> Any:
    """Make ``func`` a step task (a ``SagaStepTask`` delivering through ``engines``) and
    record its saga options."""
    refuse_unknown_options(task_options, STEP_OPTIONS, "@sagas.step")
    opts = _task_options(app, func, task_options, default_time_limit_s)
    owner = f"step {opts['name']!r}"
    transient = checked_exception_types(retry_on, option="retry_on", step=opts["name"])
    retries = checked_retries(retries, idempotent=idempotent, step=opts["name"],
                              retry_on=bool(transient))
    checked_backoff = seconds_backoff(backoff, attempts=retries, owner=owner)
    compensator = _name_of(compensate)
    _check_compensate_unknown(compensate_unknown, compensator, owner)
    if not isinstance(inline, bool):
        raise SagaConfigurationError(f"{owner}: inline must be True or False")
    task = app.task(base=SagaStepTask, engines=engines, **opts)(func)
    registry.add_step(StepOptions(
        task=opts["name"], compensator=compensator, idempotent=idempotent,
        not_committed_on=tuple(not_committed_on), retries=retries,
        backoff=checked_backoff, time_limit_ms=int(opts["time_limit"] * 1000),
        capability=values.capability(capability) if capability else EXECUTE_CAPABILITY,
        retry_on=transient, compensate_unknown=bool(compensate_unknown), inline=inline,
    ))
    return task


def _check_compensate_unknown(value: object, compensator: str | None, owner: str) -> None:
    """``compensate_unknown`` is a bool, and needs a compensator to call."""
    if not isinstance(value, bool):
        raise SagaConfigurationError(f"{owner}: compensate_unknown must be True or False")
    if value and compensator is None:
        raise SagaConfigurationError(
            f"{owner}: compensate_unknown=True needs a compensator (compensate=...) to call "
            "when the step's outcome is unknown"
        )


def register_compensator(app: Celery, registry: Registry, engines: EngineSource,
                         func: Callable[..., Any], *, name: str | None, idempotent: bool,
                         capability: str | None, default_time_limit_s: float,
                         task_options: dict[str, Any]) -> Any:
    """Make ``func`` a compensator task (a ``CompensatorTask`` delivering through
    ``engines``) and record its options."""
    refuse_unknown_options(task_options, COMPENSATOR_OPTIONS, "@sagas.compensator")
    opts = _task_options(app, func, {**task_options, **({"name": name} if name else {})},
                         default_time_limit_s)
    task = app.task(base=CompensatorTask, engines=engines, **opts)(func)
    registry.add_compensator(CompensatorOptions(
        opts["name"], idempotent,
        values.capability(capability) if capability else COMPENSATE_CAPABILITY,
        time_limit_ms=int(opts["time_limit"] * 1000),
    ))
    return task


def register_definition(registry: Registry, name: str, run: Callable[..., Any], *,
                        max_attempts: int, backoff: SecondsBackoff | None,
                        capability: str | None, compensation: object = "reverse",
                        inline: object = None) -> SagaDefinition:
    """Record a saga definition ``run(ctx, input)`` (its options checked by the caller)."""
    values.definition_name(name)
    attempts = checked_max_attempts(max_attempts)
    checked = seconds_backoff(backoff, attempts=attempts, owner=f"saga {name!r}")
    if compensation not in COMPENSATION_ORDERS:
        raise SagaConfigurationError(
            f"saga {name!r}: compensation must be one of {', '.join(COMPENSATION_ORDERS)}, "
            f"got {str(compensation)[:40]!r}")
    if inline is not None and not isinstance(inline, bool):
        raise SagaConfigurationError(f"saga {name!r}: inline must be True, False or None")
    definition = SagaDefinition(name, run, max_attempts, checked, capability,
                                compensation=str(compensation), inline=inline)
    registry.add_definition(definition)
    return definition


def checked_secrets(secrets: tuple[bytes | str, ...]) -> tuple[bytes | str, ...]:
    """Approval secrets a token signer accepts; SagaConfigurationError otherwise."""
    if not secrets:
        return ()
    try:
        TokenSigner(secrets)
    except SagaValidationError as exc:
        raise SagaConfigurationError(f"sagas_approval_secrets: {exc}") from None
    return secrets


def _check_time_limit(seconds: object) -> None:
    """A saga task needs a hard limit: past it (plus grace) a silent attempt is judged."""
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or not 0 < seconds <= _MAX_TIME_LIMIT_S):
        raise SagaConfigurationError(
            f"time_limit must be a positive number of seconds, at most {_MAX_TIME_LIMIT_S}, "
            f"got {seconds!r}"
        )


def _is_pickle(serializer: object) -> bool:
    return isinstance(serializer, str) and serializer.lower() in _PICKLE


def refuse_pickle_accepted(accepted: object) -> None:
    """Workers that accept pickle run whatever anyone who can write to the broker sends."""
    if isinstance(accepted, str):
        accepted = (accepted,)
    if isinstance(accepted, (list, tuple, set, frozenset)) and any(map(_is_pickle, accepted)):
        raise SagaConfigurationError(
            "celery_sagas refuses accept_content with pickle: anyone who can write to the "
            "broker could run code in your workers. Use accept_content=['json']."
        )


def refuse_pickle(serializer: object) -> None:
    """Refuse the pickle serializer."""
    if _is_pickle(serializer):
        raise SagaConfigurationError(
            "celery_sagas refuses the pickle serializer: anyone who can write to the broker "
            "could run code in your workers. Use task_serializer='json'."
        )
