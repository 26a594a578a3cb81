"""Lifecycle events (docs/operations.md): one per effect transition, pure values.

An event carries ids, names, states, attempts and error codes only; saga input, step
arguments, results and exception messages never enter it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._records import StepState, TextEnum

__all__ = ["LifecycleEvent", "Phase", "Stage", "effect_stage"]


class Stage(TextEnum):
    """Where an effect happens."""

    EXECUTION = "execution"
    COMPENSATION = "compensation"
    RECONCILIATION = "reconciliation"


class Phase(TextEnum):
    """What happened to the effect."""

    INTENT = "intent"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


_COMPENSATION_OUTCOMES = (StepState.COMPENSATED, StepState.COMPENSATION_FAILED)


def effect_stage(stage: Stage, step_state: StepState) -> Stage:
    """The stage of the effect an event is about: a reconciliation (operator resolution)
    settles the compensation effect when it left the step compensated or compensation-failed,
    and the execution effect otherwise."""
    if stage != Stage.RECONCILIATION:
        return stage
    return Stage.COMPENSATION if step_state in _COMPENSATION_OUTCOMES else Stage.EXECUTION


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One effect transition; ids and codes only, never payloads."""

    effect_id: str
    capability: str
    stage: Stage
    phase: Phase
    attempt: int
    saga_id: str
    definition: str
    step: str
    error_code: str | None = None
    duration_ms: int | None = None

    def log_fields(self) -> dict[str, Any]:
        """The structured ``extra`` fields of this event's log record."""
        return {
            "saga_id": self.saga_id,
            "saga_definition": self.definition,
            "saga_step": self.step,
            "effect_id": self.effect_id,
            "effect_capability": self.capability,
            "effect_stage": self.stage,
            "effect_phase": self.phase,
            "effect_attempt": self.attempt,
            "error_code": self.error_code,
            "duration_ms": self.duration_ms,
        }
