"""Reconciliation findings (docs/design.md §6): what a sweep reports about one record, pure."""

from __future__ import annotations

from dataclasses import dataclass

from .._records import EffectRecord, EffectState, SagaRecord, SagaState, StepState, TextEnum

__all__ = ["Finding", "FindingKind", "effect_finding", "saga_finding"]


class FindingKind(TextEnum):
    """Kinds of finding a sweep reports."""

    INCOMPLETE = "incomplete"
    AMBIGUOUS = "ambiguous"
    AMBIGUOUS_EXECUTION = "ambiguous-execution"
    AMBIGUOUS_COMPENSATION = "ambiguous-compensation"
    MANUAL_REVIEW = "manual-review"
    STALE = "stale"
    CORRUPT = "corrupt"
    ARCHIVE_FAILED = "archive_failed"


@dataclass(frozen=True, slots=True)
class Finding:
    """One record that needs attention; never carries payloads."""

    kind: FindingKind
    record_kind: str
    record_id: str
    state: str | None = None
    step: str | None = None
    effect_id: str | None = None
    error_code: str | None = None
    reason: str | None = None
    updated_at_ms: int | None = None


def effect_finding(effect: EffectRecord, stale_before_ms: int) -> Finding | None:
    """admission older than stale_before → incomplete; executing/unknown → ambiguous."""
    if effect.updated_at_ms >= stale_before_ms:
        return None
    if effect.state is EffectState.ADMISSION:
        kind = FindingKind.INCOMPLETE
    elif effect.state in (EffectState.EXECUTING, EffectState.UNKNOWN):
        kind = FindingKind.AMBIGUOUS
    else:
        return None
    return Finding(kind, "effect", effect.effect_id, str(effect.state), effect.step,
                   effect.effect_id, effect.error_code, None, effect.updated_at_ms)


_OPEN = (SagaState.RUNNING, SagaState.COMPENSATING, SagaState.MANUAL_REVIEW)


def saga_finding(saga: SagaRecord, stale_before_ms: int) -> Finding | None:
    """The finding (docs/design.md §6) for an open saga, or None."""
    if saga.state not in _OPEN:
        return None

    def found(kind: FindingKind, step: str | None = None, effect: str | None = None) -> Finding:
        return Finding(kind, "saga", saga.saga_id, str(saga.state), step, effect,
                       saga.error_code, saga.reason, saga.updated_at_ms)

    for step in saga.steps:
        if step.state in (StepState.EXECUTING, StepState.AMBIGUOUS):
            return found(FindingKind.AMBIGUOUS_EXECUTION, step.name, step.effect_id)
        if step.state is StepState.COMPENSATING:
            return found(FindingKind.AMBIGUOUS_COMPENSATION, step.name, step.compensation_effect_id)
    if saga.state is SagaState.MANUAL_REVIEW:
        return found(FindingKind.MANUAL_REVIEW)
    if saga.updated_at_ms < stale_before_ms:
        return found(FindingKind.STALE)
    return None
