"""The saga registry: definitions, step options and compensation retry policies."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _values as values
from ._protocol.compensation import MAX_BACKOFF_MS, default_backoff_ms
from ._protocol.decisions import SagaPolicy, StepPolicy
from .errors import SagaConfigurationError

__all__ = [
    "COMPENSATE_CAPABILITY",
    "COMPENSATION_ORDERS",
    "COMPENSATOR_OPTIONS",
    "EXECUTE_CAPABILITY",
    "STEP_OPTIONS",
    "Backoff",
    "CompensatorOptions",
    "Registry",
    "SagaDefinition",
    "SecondsBackoff",
    "StepOptions",
    "Timing",
    "checked_exception_types",
    "checked_max_attempts",
    "checked_retries",
    "seconds_backoff",
]

Backoff = Callable[[int], int]
# What users write: backoff(attempt) -> seconds (int or float), like every other duration.
SecondsBackoff = Callable[[int], float]
# run(ctx, input): ctx is a SagaContext (typed loosely here: the context module builds on this one)
RunFunction = Callable[[Any, Any], Any]


# The keywords @sagas.step and @sagas.compensator take for themselves (a unit test holds these
# against their signatures). Any other keyword must be a Celery Task option; an unknown one is
# refused at decoration, naming the closest known option.
STEP_OPTIONS = ("compensate", "idempotent", "not_committed_on", "retries", "backoff", "capability",
                "retry_on", "compensate_unknown", "inline")
COMPENSATOR_OPTIONS = ("name", "idempotent", "capability")
# How a saga's committed steps are undone: one at a time, newest first, or all at once.
COMPENSATION_ORDERS = ("reverse", "parallel")

# The capabilities of a step and a compensator that name none (approval bindings, effects).
EXECUTE_CAPABILITY = "saga.execute"
COMPENSATE_CAPABILITY = "saga.compensate"

@dataclass(frozen=True, slots=True)
class StepOptions:
    """How a step task behaves inside a saga."""

    task: str
    compensator: str | None
    idempotent: bool = False
    not_committed_on: tuple[type[BaseException], ...] = ()
    retries: int = 0
    backoff: Backoff = default_backoff_ms
    time_limit_ms: int | None = None
    capability: str = EXECUTE_CAPABILITY
    retry_on: tuple[type[BaseException], ...] = ()
    compensate_unknown: bool = False
    inline: bool = True  # False: always sent through the broker, even in an inline saga

    @property
    def attempts_per_effect(self) -> int:
        """Attempts allowed under one effect id (1 unless idempotent or retried on ``retry_on``)."""
        return 1 + self.retries if self.idempotent or self.retry_on else 1


@dataclass(frozen=True, slots=True)
class CompensatorOptions:
    """How a compensator task behaves."""

    name: str
    idempotent: bool = False
    capability: str = COMPENSATE_CAPABILITY
    time_limit_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SagaDefinition:
    """A named ``run(ctx, input)`` function and its compensation retry policy."""

    name: str
    run: RunFunction
    max_compensation_attempts: int = 3
    backoff: Backoff = default_backoff_ms
    capability: str | None = None
    compensation: str = "reverse"  # or "parallel": every compensator sent at once
    inline: bool | None = None  # run the next step in the settling process (None: the setting)


@dataclass(frozen=True, slots=True)
class Timing:
    """Durations the engine judges in-flight work by (ms)."""

    stale_ms: int = 30_000
    grace_ms: int = 30_000
    default_time_limit_ms: int = 300_000


# Retries (steps) and compensation attempts (sagas): past this a loop, not a policy.
MAX_RETRIES = 100
DEFAULT_IDEMPOTENT_RETRIES = 2  # three attempts in all, as compensators get by default


def checked_retries(retries: object, *, idempotent: bool, step: str,
                    retry_on: bool = False) -> int:
    """The retries of a step: given explicitly, or 2 for an idempotent step or one with
    ``retry_on`` types (3 attempts).

    A step that is not idempotent is never retried after an unknown outcome (it would be
    guessed), so ``retries`` without ``idempotent=True`` or ``retry_on=`` is a mistake to
    report, not to ignore.
    """
    if retries is None:
        return DEFAULT_IDEMPOTENT_RETRIES if idempotent or retry_on else 0
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise SagaConfigurationError(
            f"step {step!r}: retries must be an int in 0..{MAX_RETRIES}, got {retries!r}"
        )
    if retries and not idempotent and not retry_on:
        raise SagaConfigurationError(
            f"step {step!r}: retries={retries} needs idempotent=True or retry_on= (only a step "
            "that is safe to repeat with the same effect id, or whose failure proves nothing "
            "was committed, is retried; see docs/concepts.md)"
        )
    return retries


def checked_exception_types(types: object, *, option: str, step: str) -> tuple[type[Exception], ...]:
    """A step's ``not_committed_on=`` or ``retry_on=``: a tuple (or one) of Exception classes."""
    items = (types,) if isinstance(types, type) else types
    if not isinstance(items, (tuple, list)) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in items):
        raise SagaConfigurationError(
            f"step {step!r}: {option}= takes a tuple of Exception classes, got {_shown(types)}"
        )
    return tuple(items)


class _Seconds:
    """A user's ``backoff(attempt) -> seconds`` as the engine's backoff in ms; raises
    SagaConfigurationError for anything but a number of seconds from 0 to 366 days."""

    __slots__ = ("owner", "user")

    def __init__(self, user: SecondsBackoff, owner: str) -> None:
        self.user = user
        self.owner = owner

    def __call__(self, attempt: int) -> int:
        try:
            value = self.user(attempt)
        except Exception as exc:
            raise SagaConfigurationError(
                f"{self.owner}: backoff({attempt}) raised {type(exc).__name__}"
            ) from exc
        ms = _seconds_to_ms(value)
        if ms is None:
            raise SagaConfigurationError(
                f"{self.owner}: backoff({attempt}) returned {_shown(value)}; it must return "
                f"seconds, a number from 0 to {MAX_BACKOFF_MS // 1000}"
            )
        return ms


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _seconds_to_ms(value: object) -> int | None:
    value = values.plain_seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not 0 <= value <= MAX_BACKOFF_MS // 1000:
        return None
    return round(value * 1000)


def seconds_backoff(backoff: object, *, attempts: int, owner: str) -> Backoff:
    """The engine's backoff (ms) for a user's ``backoff(attempt) -> seconds``, or the default;
    the user's function is called for attempts 1..``attempts`` here, so a policy that cannot
    work is refused at decoration (SagaConfigurationError)."""
    if backoff is None:
        return default_backoff_ms
    if not callable(backoff):
        raise SagaConfigurationError(f"{owner}: backoff must be a function of the attempt number")
    converted = _Seconds(backoff, owner)
    for attempt in range(1, attempts + 1):
        converted(attempt)
    return converted


def checked_max_attempts(max_attempts: object) -> int:
    """A saga's compensation attempts per step: an int in 1..MAX_RETRIES."""
    if (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= MAX_RETRIES):
        raise SagaConfigurationError(
            f"max_attempts must be an int in 1..{MAX_RETRIES}, got {max_attempts!r}"
        )
    return max_attempts


def _check_policy(max_attempts: object, backoff: object) -> None:
    checked_max_attempts(max_attempts)
    if not callable(backoff):
        raise SagaConfigurationError("backoff must be a function of the attempt number")


@dataclass
class Registry:
    """Every saga definition, step and compensator known to this process."""

    definitions: dict[str, SagaDefinition] = field(default_factory=dict)
    steps: dict[str, StepOptions] = field(default_factory=dict)
    compensators: dict[str, CompensatorOptions] = field(default_factory=dict)
    _policies: dict[tuple[str, Timing], SagaPolicy] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_definition(self, definition: SagaDefinition) -> None:
        """Register a saga definition; a name can be defined once."""
        values.definition_name(definition.name)
        _check_policy(definition.max_compensation_attempts, definition.backoff)
        with self._lock:
            if definition.name in self.definitions:
                raise SagaConfigurationError(f"saga {definition.name!r} is already defined")
            self.definitions[definition.name] = definition
            self._policies.clear()

    def add_step(self, options: StepOptions) -> None:
        """Register the saga options of a step task (checked by ``checked_retries`` and
        ``seconds_backoff``)."""
        with self._lock:
            self.steps[options.task] = options
            self._policies.clear()

    def add_compensator(self, options: CompensatorOptions) -> None:
        """Register a compensator task."""
        with self._lock:
            self.compensators[options.name] = options
            self._policies.clear()

    def definition(self, name: str) -> SagaDefinition:
        """The definition called ``name``; SagaConfigurationError if unknown."""
        try:
            return self.definitions[name]
        except KeyError:
            raise SagaConfigurationError(f"no saga definition {name!r} in this process") from None

    def step(self, task: str) -> StepOptions:
        """The saga options of a step task; SagaConfigurationError if unknown."""
        try:
            return self.steps[task]
        except KeyError:
            raise SagaConfigurationError(f"{task!r} is not a saga step (use @sagas.step)") from None

    def policy(self, definition: SagaDefinition, timing: Timing) -> SagaPolicy:
        """The decision policy of a saga definition (cached until the registry changes)."""
        key = (definition.name, timing)
        cached = self._policies.get(key)
        if cached is not None:
            return cached
        steps: Mapping[str, StepPolicy] = {
            name: StepPolicy(o.idempotent, o.attempts_per_effect, o.compensate_unknown,
                             bool(o.retry_on))
            for name, o in self.steps.items()
        }
        idempotent = frozenset(n for n, o in self.compensators.items() if o.idempotent)
        limits = {n: o.time_limit_ms for n, o in self.compensators.items() if o.time_limit_ms}
        policy = SagaPolicy(
            max_compensation_attempts=definition.max_compensation_attempts,
            stale_ms=timing.stale_ms,
            grace_ms=timing.grace_ms,
            default_time_limit_ms=timing.default_time_limit_ms,
            steps=steps,
            compensators_idempotent=idempotent,
            compensator_time_limits=limits,
            parallel_compensation=definition.compensation == "parallel",
        )
        self._policies[key] = policy
        return policy
