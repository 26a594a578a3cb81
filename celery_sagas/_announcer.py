"""Announce a step's effect transitions as lifecycle events (docs/operations.md).

The engine, the planner and a delivery each tell the ``Announcer`` what moved; it works out the
effect (execution or compensation), its capability and attempt, and publishes one
``LifecycleEvent`` to the runtime's middlewares (``on_event``: logs, observers, metrics,
tracing).
"""

from __future__ import annotations

from ._definitions import COMPENSATE_CAPABILITY, EXECUTE_CAPABILITY, Registry
from ._events import LifecycleEvent, Phase, Stage, effect_stage
from ._middleware import Middlewares
from ._records import SagaRecord, StepRecord

__all__ = ["Announcer"]


class Announcer:
    """Publishes effect transitions to the middlewares, each with its effect's capability."""

    def __init__(self, middlewares: Middlewares, registry: Registry) -> None:
        self.middlewares = middlewares
        self.registry = registry

    def emit(
        self, saga: SagaRecord, step: StepRecord, stage: Stage, phase: Phase,
        error_code: str | None = None, duration_ms: int | None = None,
    ) -> None:
        """Publish a step's effect transition as a lifecycle event.

        ``saga`` is the record after the move (``step`` may be the step before it): the
        step's state there tells which effect an operator's resolution settled.
        """
        current = saga.step(step.name) or step
        compensating = effect_stage(stage, current.state) == Stage.COMPENSATION
        self.middlewares.on_event(LifecycleEvent(
            effect_id=step.compensation_effect_id if compensating else step.effect_id,
            capability=self.capability(saga, step, compensating),
            stage=stage,
            phase=phase,
            attempt=step.compensation_attempts if compensating else step.attempts,
            saga_id=saga.saga_id,
            definition=saga.definition,
            step=step.name,
            error_code=error_code,
            duration_ms=duration_ms,
        ))

    def capability(self, saga: SagaRecord, step: StepRecord, compensating: bool) -> str:
        """The capability of a step's effect: the step's (or compensator's) option if set, else
        the definition's (steps only), else the default."""
        if compensating:
            comp = self.registry.compensators.get(step.compensator or "")
            return comp.capability if comp else COMPENSATE_CAPABILITY
        options = self.registry.steps.get(step.task)
        if options is not None and options.capability != EXECUTE_CAPABILITY:
            return options.capability
        definition = self.registry.definitions.get(saga.definition)
        if definition is not None and definition.capability:
            return definition.capability
        return EXECUTE_CAPABILITY
