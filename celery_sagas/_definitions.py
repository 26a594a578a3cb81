"""The saga registry: definitions, step options and compensation retry policies."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _values as values
from ._protocol.compensation import default_backoff_ms
from ._protocol.decisions import SagaPolicy, StepPolicy
from .errors import SagaConfigurationError

__all__ = [
    "COMPENSATE_CAPABILITY",
    "EXECUTE_CAPABILITY",
    "Backoff",
    "CompensatorOptions",
    "Registry",
    "SagaDefinition",
    "StepOptions",
    "Timing",
]

Backoff = Callable[[int], int]
# run(ctx, input): ctx is a SagaContext (typed loosely here: the context module builds on this one)
RunFunction = Callable[[Any, Any], Any]


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

    @property
    def attempts_per_effect(self) -> int:
        """Attempts allowed under one effect id (1 unless idempotent)."""
        return 1 + self.retries if self.idempotent else 1


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


@dataclass(frozen=True, slots=True)
class Timing:
    """Durations the engine judges in-flight work by (ms)."""

    stale_ms: int = 30_000
    grace_ms: int = 30_000
    default_time_limit_ms: int = 300_000


def _check_policy(max_attempts: object, backoff: object) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise SagaConfigurationError(f"max_attempts must be a positive int, got {max_attempts!r}")
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
        """Register the saga options of a step task."""
        if options.retries < 0:
            raise SagaConfigurationError("retries must be >= 0")
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
            name: StepPolicy(o.idempotent, o.attempts_per_effect) for name, o in self.steps.items()
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
        )
        self._policies[key] = policy
        return policy
