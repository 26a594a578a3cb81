"""Reconciliation findings (docs/design.md §6): what a sweep reports about one record, pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .._records import (
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
    TextEnum,
)
from . import codes
from .compensation import commit_order
from .kinds import HELD_STATES

__all__ = [
    "Finding",
    "FindingKind",
    "Hint",
    "effect_finding",
    "hint_of",
    "holds",
    "review_advice",
    "saga_finding",
]


class FindingKind(TextEnum):
    """Kinds of finding a sweep reports."""

    INCOMPLETE = "incomplete"
    AMBIGUOUS = "ambiguous"
    AMBIGUOUS_EXECUTION = "ambiguous-execution"
    AMBIGUOUS_COMPENSATION = "ambiguous-compensation"
    MANUAL_REVIEW = "manual-review"
    STALE = "stale"
    CORRUPT = "corrupt"
    UNDECRYPTABLE = "undecryptable"
    ARCHIVE_FAILED = "archive_failed"


@dataclass(frozen=True, slots=True)
class Finding:
    """One record that needs attention (docs/design.md §6); ids, states and codes, never
    payloads. What a sweep reports to observers and logs is ``observed``: its free-text
    ``reason`` only for a corrupt record (the library's own words), and the sweep's fence."""

    kind: FindingKind
    record_kind: str
    record_id: str
    state: str | None = None
    step: str | None = None
    effect_id: str | None = None
    error_code: str | None = None
    reason: str | None = None
    updated_at_ms: int | None = None
    fence: int | None = None  # the fence of the sweep that reported it

    @property
    def cause(self) -> str | None:
        """A corrupt record's cause (the library's words, never record content), else None."""
        return self.reason if self.kind == FindingKind.CORRUPT else None

    def observed(self, fence: int | None = None) -> Finding:
        """This finding as the sweep reports it to observers and logs: no saga's free-text
        reason (a corrupt record's cause is kept), with the sweep's fence."""
        return replace(self, reason=self.cause, fence=fence)

    def log_fields(self) -> dict[str, Any]:
        """The structured ``extra`` fields of this finding's log record."""
        return {
            "corrupt_cause": self.cause,
            "finding_kind": self.kind,
            "record_kind": self.record_kind,
            "record_id": self.record_id,
            "record_state": self.state,
            "saga_step": self.step,
            "effect_id": self.effect_id,
            "error_code": self.error_code,
            "updated_at_ms": self.updated_at_ms,
            "sweep_fence": self.fence,
        }


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

_FIX_AND_RESUME = "deploy the fix, then resume; or cancel to compensate what committed"

# What an operator does about a saga in manual review, by its error code (docs/errors.md).
_REVIEW_ADVICE = {
    codes.COMPENSATION_EXHAUSTED: (
        "fix what makes the compensator fail, then resume: it gets a fresh budget under the "
        "same compensation effect id; or undo the step by hand, resolve it --compensated, "
        "then resume"),
    codes.NONDETERMINISTIC: (
        "run() asked for other steps than recorded: deploy a run() that replays the recorded "
        "steps the same way, then resume; or cancel to compensate what committed"),
    codes.RUN_FAILED: "run() raised: " + _FIX_AND_RESUME,
    codes.INVALID_STEP_CALL: "run() made a step call that cannot be recorded: " + _FIX_AND_RESUME,
    codes.INVALID_RETRY_POLICY: "a backoff returned an invalid delay: " + _FIX_AND_RESUME,
    codes.PAYLOAD_TOO_LARGE: (
        "a value is over sagas_payload_limit: change the code or the limit, then resume; or "
        "cancel to compensate what committed"),
}


def review_advice(error_code: str | None) -> str:
    """What to do about a saga in manual review with ``error_code`` (true for each code)."""
    if error_code in _REVIEW_ADVICE:
        return _REVIEW_ADVICE[error_code]
    return f"fix the cause ({error_code or 'see the reason'}), then resume; or cancel to " \
           "compensate what committed"


@dataclass(frozen=True, slots=True)
class Hint:
    """What an operator does about a finding, in the CLI's words and in the web UI's."""

    cli: str
    web: str


_UNREADABLE = Hint("{kind} record failed read validation: inspect it in the store",
                   "The {kind} record failed read validation: inspect it in the store.")
_HINTS = {  # templates naming {saga}, {step}, {effect} and {kind} (the record's)
    FindingKind.AMBIGUOUS_EXECUTION: Hint(
        "ask the provider about idempotency key {effect}, then: resolve {saga} "
        "--step {step} --effect-id {effect} --committed --result JSON | --not-committed",
        "Ask the provider whether the request with idempotency key {effect} went "
        "through. Record the answer (committed with its result, or not committed), "
        "then resume."),
    FindingKind.AMBIGUOUS_COMPENSATION: Hint(
        "ask the provider whether {effect} was undone, then: resolve {saga} "
        "--step {step} --effect-id {effect} --compensated | --not-compensated",
        "Ask the provider whether {effect} was undone. Record compensated or not "
        "compensated, then resume."),
    FindingKind.STALE: Hint("not updated for stale_after: is beat running the sweep?",
                            "Not updated for stale_after: is beat running the sweep?"),
    FindingKind.AMBIGUOUS: Hint(
        "began long ago and its outcome is unknown: ask the provider about this effect id",
        "Began long ago and its outcome is unknown: ask the provider about this effect "
        "id, then resolve the step from its saga's finding (every saga with effect "
        "findings has one)."),
    FindingKind.INCOMPLETE: Hint(
        "admitted but never began: see its saga (the sweep re-drives it)",
        "Admitted but never began: the sweep re-drives it; its saga's finding says "
        "whether workers and beat are up."),
    FindingKind.UNDECRYPTABLE: Hint(
        "encrypted with a key not in sagas_encryption_keys: list that key again and restart "
        "(nothing acts on it meanwhile)",
        "Encrypted with a key not in sagas_encryption_keys: list that key again and "
        "restart. Nothing acts on it meanwhile."),
    FindingKind.ARCHIVE_FAILED: Hint(  # the UI has no words of its own for it yet
        "past retention but the archive raised: kept; fix the archive (see the ERROR log)",
        _UNREADABLE.web),
}
_WAITING_HINTS = {  # its saga is not (yet) in manual review: the sweep still acts
    FindingKind.AMBIGUOUS_EXECUTION: Hint(
        "sent or running past stale_after: the sweep re-sends a step never started "
        "and judges a silent one past its time limit (are workers up?)",
        "Sent or running past stale_after: the sweep re-sends a step never started "
        "and judges a silent one past its time limit. Are workers and beat up?"),
    FindingKind.AMBIGUOUS_COMPENSATION: Hint(
        "compensator sent or running past stale_after: the sweep re-sends or "
        "judges it (are workers up?)",
        "Compensator sent or running past stale_after: the sweep re-sends or judges "
        "it. Are workers up?"),
}


def hint_of(finding: Finding) -> Hint:
    """A finding's hint by its kind and whether its saga waits in manual review; a
    ``MANUAL_REVIEW`` finding gets the unreadable-record one (its advice is ``review_advice``)."""
    template = _HINTS.get(finding.kind, _UNREADABLE)
    if finding.state != str(SagaState.MANUAL_REVIEW):
        template = _WAITING_HINTS.get(finding.kind, template)
    names = {"saga": finding.record_id, "step": finding.step, "effect": finding.effect_id,
             "kind": finding.record_kind}
    return Hint(template.cli.format(**names), template.web.format(**names))


def _unknown(step: StepRecord, review: bool) -> bool | None:
    """Whether ``step`` is an outcome to report: True (compensation), False (execution) or
    None. In review only an outcome nobody knows counts (one ``resolve`` settles): a step sent
    but never claimed, released for a retry or still running has none to ask a provider about
    (a running one that goes silent turns ambiguous by itself)."""
    if step.state is StepState.AMBIGUOUS:
        return False
    if step.state is StepState.COMPENSATING and step.error_code == codes.AMBIGUOUS_COMPENSATION:
        return True
    if review:
        return None
    if step.state is StepState.EXECUTING:
        return False
    return True if step.state is StepState.COMPENSATING else None


def _exhausted(saga: SagaRecord) -> StepRecord | None:
    """The step whose compensation budget ran out (the one the planner stopped at)."""
    if saga.error_code != codes.COMPENSATION_EXHAUSTED:
        return None
    failed = [s for s in commit_order(saga) if s.state is StepState.COMPENSATION_FAILED]
    return failed[0] if failed else None


def holds(step: StepRecord, stale_before_ms: int) -> bool:
    """True when ``step`` holds its saga by design (a timer, a signal wait, a child saga, an
    approval gate) and is not overdue: no wake-up time, or one less than ``stale_after`` past."""
    return step.state in HELD_STATES and (step.wake_at_ms is None or step.wake_at_ms >= stale_before_ms)


def saga_finding(saga: SagaRecord, stale_before_ms: int) -> Finding | None:
    """The finding (docs/design.md §6) for an open saga, or None."""
    if saga.state not in _OPEN:
        return None

    def found(kind: FindingKind, step: str | None = None, effect: str | None = None) -> Finding:
        return Finding(kind, "saga", saga.saga_id, str(saga.state), step, effect,
                       saga.error_code, saga.reason, saga.updated_at_ms)

    review = saga.state is SagaState.MANUAL_REVIEW
    for step in saga.steps:
        compensation = _unknown(step, review)
        if compensation is True:
            return found(FindingKind.AMBIGUOUS_COMPENSATION, step.name, step.compensation_effect_id)
        if compensation is False:
            return found(FindingKind.AMBIGUOUS_EXECUTION, step.name, step.effect_id)
    if review:
        exhausted = _exhausted(saga)
        if exhausted is not None:
            return found(FindingKind.MANUAL_REVIEW, exhausted.name,
                         exhausted.compensation_effect_id)
        return found(FindingKind.MANUAL_REVIEW)
    if any(holds(step, stale_before_ms) for step in saga.steps):
        return None  # waiting for a timer, a signal, a child or an approval: not stale
    if saga.updated_at_ms < stale_before_ms:
        return found(FindingKind.STALE)
    return None
