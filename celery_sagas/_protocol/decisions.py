"""Decisions: what the engine should do next for a saga, as frozen values, and the policy
those decisions depend on. ``protocol.decide`` chooses them; the engine carries them out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._records import StepRecord

__all__ = [
    "Abandon",
    "Append",
    "BeginCompensation",
    "Complete",
    "Decision",
    "FinishCompensation",
    "Redispatch",
    "Review",
    "SagaPolicy",
    "StartCompensation",
    "StepPolicy",
    "Vanished",
    "Wait",
    "Wake",
]


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """What the definition says about one step task."""

    idempotent: bool = False
    attempts_per_effect: int = 1
    compensate_unknown: bool = False
    retry_on: bool = False  # declares retry_on types: retried after failures that committed nothing


@dataclass(frozen=True, slots=True)
class SagaPolicy:
    """Timing and retry limits that decisions depend on (all durations in ms)."""

    max_compensation_attempts: int
    stale_ms: int
    grace_ms: int
    default_time_limit_ms: int
    steps: Mapping[str, StepPolicy] = field(default_factory=dict)
    compensators_idempotent: frozenset[str] = frozenset()
    compensator_time_limits: Mapping[str, int] = field(default_factory=dict)
    parallel_compensation: bool = False

    def step(self, task: str) -> StepPolicy:
        """The policy of a step task (defaults when unknown)."""
        return self.steps.get(task, StepPolicy())


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now; look again at ``until_ms`` (None: when something reports)."""

    until_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Append:
    """Record these new steps as executing (or waiting), then dispatch the executing ones;
    ``patches`` are the ``ctx.patched`` ids the replay passed first (docs/design.md §3.6)."""

    steps: tuple[StepRecord, ...]
    patches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Wake:
    """Commit a waiting step with ``result`` (a timer fired, a signal came, a wait timed out);
    ``signal_id`` is the signal it consumes."""

    step: StepRecord
    result: Any
    signal_id: str | None = None


@dataclass(frozen=True, slots=True)
class _OfEffect:
    """Which effect of a step a decision is about: its execution, or (``compensation``) its
    compensator's."""

    step: StepRecord
    compensation: bool


@dataclass(frozen=True, slots=True)
class Redispatch(_OfEffect):
    """Send an unclaimed step (or its compensator) again under the same effect id."""


@dataclass(frozen=True, slots=True)
class Vanished(_OfEffect):
    """A claimed attempt went silent: retry it (idempotent), declare it ambiguous, or (a step
    declared ``compensate_unknown``, ``compensate``) compensate it."""

    retry: bool
    error_code: str
    compensate: bool = False


@dataclass(frozen=True, slots=True)
class Abandon:
    """While rolling back, fail a step that was never claimed (``nothing_committed``: or one
    waiting for a retry whose last attempt provably committed nothing)."""

    step: StepRecord
    nothing_committed: bool = False


@dataclass(frozen=True, slots=True)
class BeginCompensation:
    """Record the compensation intent of a committed step, then dispatch its compensator."""

    step: StepRecord


@dataclass(frozen=True, slots=True)
class Complete:
    """Every step committed and run() returned ``result``."""

    patches: tuple[str, ...] = ()
    result: Any = None


@dataclass(frozen=True, slots=True)
class FinishCompensation:
    """Every committed step is undone."""


@dataclass(frozen=True, slots=True)
class _TurnBack:
    """Why a saga leaves its forward path: the error code and reason written to its record."""

    error_code: str
    reason: str


@dataclass(frozen=True, slots=True)
class StartCompensation(_TurnBack):
    """run() refused to go on (raised StepNotCommitted): roll back."""


@dataclass(frozen=True, slots=True)
class Review(_TurnBack):
    """Stop for an operator (``exception``: what user code raised, ``traceback``: where; both
    kept in the record)."""

    exception: str | None = None
    traceback: str | None = None


Decision = (
    Wait
    | Append
    | Redispatch
    | Vanished
    | Abandon
    | Wake
    | BeginCompensation
    | Complete
    | FinishCompensation
    | StartCompensation
    | Review
)
