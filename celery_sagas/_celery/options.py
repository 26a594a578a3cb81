"""The keywords a saga decorator hands to Celery: each must be an option Celery's ``Task``
knows, so that a misspelt saga option (``idempotnet=True``) is refused instead of ignored."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Task

from ..errors import SagaConfigurationError

__all__ = ["CELERY_TASK_OPTIONS", "refuse_unknown_options"]

# Keywords of Celery's task decorator and execution options that are not Task class attributes.
_DECORATOR_ONLY = frozenset({
    "base", "bind", "shared", "lazy", "filter", "name", "autoretry_for", "dont_autoretry_for",
    "retry_kwargs", "retry_backoff", "retry_backoff_max", "retry_jitter", "pydantic",
    "pydantic_strict", "pydantic_context", "pydantic_dump_kwargs", "queue", "exchange",
    "routing_key", "delivery_mode", "compression", "immediate", "mandatory",
})


def _task_attributes() -> frozenset[str]:
    """The public settings of Celery's ``Task`` (class attributes that are not methods)."""
    return frozenset(name for cls in Task.__mro__ for name, value in vars(cls).items()
                     if not name.startswith("_") and not callable(value))


CELERY_TASK_OPTIONS = _task_attributes() | _DECORATOR_ONLY


def refuse_unknown_options(options: Mapping[str, Any], own: Iterable[str], decorator: str) -> None:
    """SagaConfigurationError for a keyword neither ``decorator`` (its ``own`` options) nor
    Celery's ``Task`` knows, naming the closest known option."""
    known = set(own) | CELERY_TASK_OPTIONS
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f": did you mean {close[0]}=?" if close else ""
            raise SagaConfigurationError(
                f"{decorator} got an unknown option {key}={hint} (its own options: "
                f"{', '.join(own)}; any other keyword must be an option of Celery's Task)"
            )
