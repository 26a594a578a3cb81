"""What the pages say: times, effects, lifecycle rows, what to do about a finding, which forms
a step or finding gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_sagas import (
    EffectState,
    Finding,
    FindingKind,
    Phase,
    SagaRecord,
    SagaState,
    Stage,
    StepRecord,
    StepState,
)

from .._cli_format import iso
from .._protocol.findings import hint_of, review_advice
from .._protocol.kinds import HELD_STATES, child_id_of, kind_of
from .._protocol.moves import unresolved_ambiguity
from .._protocol.waiting import signal_name_of

if TYPE_CHECKING:
    from .._records import EffectMark  # the type of StepRecord.execution, not exported

__all__ = [
    "COMPENSATION",
    "DONE",
    "EXECUTION",
    "EffectRow",
    "LifecycleRow",
    "Raised",
    "SagaActions",
    "child_of",
    "deadline_of",
    "effect_rows",
    "finding_forms",
    "hint",
    "iso",
    "lifecycle",
    "next_attempt",
    "outcomes",
    "raised",
    "resolution",
    "saga_actions",
]

EXECUTION = "execution"
COMPENSATION = "compensation"
_OUTCOMES = {
    EXECUTION: (("committed", "committed: it happened (give its result)"),
                ("not-committed", "not committed: it provably did not happen")),
    COMPENSATION: (("compensated", "compensated: it was undone"),
                   ("not-compensated", "not compensated: it was not undone")),
}
# What a redirect after an action may announce: fixed texts, never anything from the request.
DONE = {
    "resolve": "Resolved. Resume the saga to drive it on (or let the sweep do it).",
    "resume": "Resumed: the saga goes on from where it stopped.",
    "cancel": "Cancelled: what committed is being compensated.",
    "approve": "Approved. The requester resumes the saga with their token.",
    "deny": "Denied: the saga compensates what came before the gate.",
    "signal": "Signal sent.",
}


def outcomes(kind: str) -> tuple[tuple[str, str], ...]:
    """The outcomes an operator can record for an execution or a compensation."""
    return _OUTCOMES[kind]


def resolution(record: SagaRecord, step: StepRecord) -> str | None:
    """Which effect of ``step`` an operator can settle now (execution, compensation or None)."""
    if step.state is StepState.AMBIGUOUS:
        return EXECUTION
    if record.state is not SagaState.MANUAL_REVIEW:
        return None
    if step.state is StepState.EXECUTING and step.started_at_ms is not None:
        return EXECUTION
    if step.state in (StepState.COMPENSATING, StepState.COMPENSATION_FAILED):
        return COMPENSATION
    return None


@dataclass(frozen=True, slots=True)
class SagaActions:
    """What an operator can do to a saga now: each True only where the facade would act;
    ``why_none`` says why nothing can be done when nothing can."""

    resume: bool
    cancel: bool
    signals: tuple[str, ...]
    why_none: str | None


_IN_FLIGHT = (StepState.EXECUTING, *HELD_STATES, StepState.COMPENSATING)


def saga_actions(record: SagaRecord) -> SagaActions:
    """The actions that can work on ``record`` as it stands (docs/operations.md, "The web UI")."""
    blocking = unresolved_ambiguity(record)
    unresolved = [] if blocking is None else [blocking.name]
    review = record.state is SagaState.MANUAL_REVIEW
    # The facade's own rules (moves.resume, moves.cancel): never a button it would refuse.
    # Resume also drives on a running saga with nothing in flight (after a resolve, say):
    # the facade advances it; on one with a step in flight it would change nothing.
    idle = record.state is SagaState.RUNNING and not any(s.state in _IN_FLIGHT for s in record.steps)
    resume = (review and not unresolved) or idle
    cancel = record.state is SagaState.RUNNING or (review and not unresolved)
    signals = tuple(dict.fromkeys(
        name for step in record.steps if step.state is StepState.WAITING
        and (name := signal_name_of(step)) is not None)) if record.state is SagaState.RUNNING else ()
    return SagaActions(resume, cancel, signals, _why_none(record, unresolved)
                       if not (resume or cancel or signals) else None)


def _why_none(record: SagaRecord, unresolved: list[str]) -> str:
    if record.state.final:
        return f"The saga is {record.state}: nothing is left to do."
    if unresolved:
        return (f"Resolve {', '.join(unresolved)} first (ask the provider, record what it says "
                "below); then resume or cancel.")
    if record.state is SagaState.COMPENSATING:
        return "The saga is compensating by itself: nothing to do unless it stops (see the queue)."
    return "The saga moves on by itself: nothing to do."


def finding_forms(finding: Finding) -> tuple[str, ...]:
    """The forms a finding's row offers: resolve-execution, resolve-compensation, resume, cancel."""
    review = finding.state == str(SagaState.MANUAL_REVIEW)
    if finding.record_kind != "saga":
        return ()
    if finding.kind is FindingKind.AMBIGUOUS_EXECUTION and review:
        return ("resolve-execution",)
    if finding.kind is FindingKind.AMBIGUOUS_COMPENSATION and review:
        return ("resolve-compensation",)
    if finding.kind is FindingKind.MANUAL_REVIEW:
        return ("resume", "cancel")
    if finding.state == str(SagaState.RUNNING):
        return ("cancel",)
    return ()


def hint(finding: Finding) -> str:
    """What an operator does about a finding, in the UI's words."""
    if finding.kind is FindingKind.MANUAL_REVIEW:
        advice = review_advice(finding.error_code)
        return advice[0].upper() + advice[1:] + "."
    return hint_of(finding).web


@dataclass(frozen=True, slots=True)
class Raised:
    """An exception as a record keeps it (``"Type: message"``): its type and its message."""

    type: str
    message: str


def raised(text: str | None) -> Raised | None:
    """The type and message of a recorded exception text, or None."""
    if not text:
        return None
    name, sep, message = text.partition(": ")
    if sep and name.replace(".", "").replace("_", "").isalnum():
        return Raised(name, message)
    return Raised(text, "") if text.replace(".", "").replace("_", "").isalnum() else Raised("", text)


def deadline_of(step: StepRecord) -> str:
    """What a held step's ``wake_at_ms`` is, as its kind says: "wakes at", "times out at"."""
    return f"{kind_of(step).deadline} at"


def child_of(step: StepRecord) -> str | None:
    """The id of the child saga a step started, or None for any other step."""
    return child_id_of(step)


def next_attempt(record: SagaRecord, step: StepRecord) -> int | None:
    """When the step's next attempt is due, or None when none will come by itself: nothing
    is retried while the saga waits in manual review (an exhausted compensation among them)."""
    if record.state is SagaState.MANUAL_REVIEW or record.state.final:
        return None
    return step.next_attempt_at_ms


# ---------------------------------------------------------------- effects and lifecycle


@dataclass(frozen=True, slots=True)
class EffectRow:
    """One effect of a step as its mark says (docs/design.md §2.3); state None: not begun."""

    stage: str
    effect_id: str
    state: str | None
    at_ms: int | None
    attempt: int
    error_code: str | None


def effect_rows(step: StepRecord) -> list[EffectRow]:
    """The step's execution and (once begun, or where a compensator exists) compensation;
    none for an approval gate, a timer, a signal wait or a child step, which cause no side
    effect of their own (the page says what they wait for)."""
    if kind_of(step).held:
        return []
    rows = [_effect_row(Stage.EXECUTION, step.effect_id, step.execution, step.attempts)]
    if step.compensator or step.compensation is not None:
        rows.append(_effect_row(Stage.COMPENSATION, step.compensation_effect_id, step.compensation,
                                step.compensation_attempts))
    return rows


def _effect_row(stage: Stage, effect_id: str, mark: EffectMark | None, attempts: int) -> EffectRow:
    if mark is None:
        return EffectRow(str(stage), effect_id, None, None, attempts, None)
    return EffectRow(str(stage), effect_id, str(mark.state), mark.at_ms, mark.attempt or attempts,
                     mark.error_code)


@dataclass(frozen=True, slots=True)
class LifecycleRow:
    """One lifecycle event of a saga's step, as its record keeps it (time None: not kept)."""

    at_ms: int | None
    step: str
    stage: str
    phase: str
    attempt: int
    effect_id: str
    error_code: str | None = None


_FORWARD = (StepState.EXECUTING, *HELD_STATES, StepState.COMMITTED, StepState.FAILED,
            StepState.AMBIGUOUS)
_PHASE_OF = {EffectState.COMMITTED: Phase.COMMITTED, EffectState.FAILED: Phase.FAILED,
             EffectState.UNKNOWN: Phase.AMBIGUOUS}


def lifecycle(record: SagaRecord) -> list[LifecycleRow]:
    """The saga's lifecycle events, in time order, as far as its record keeps them: the
    forward times while a step goes forward (its compensation reuses the dispatch and start
    fields), the commit time, and each effect's final or unknown state with its mark's time."""
    rows: list[LifecycleRow] = []
    for step in record.steps:
        rows += _execution_events(step)
        rows += _compensation_events(step)
    return sorted(rows, key=lambda row: (row.at_ms is None, row.at_ms or 0))


def _execution_events(step: StepRecord) -> list[LifecycleRow]:
    def row(at: int | None, phase: Phase, code: str | None = None) -> LifecycleRow:
        return LifecycleRow(at, step.name, str(Stage.EXECUTION), str(phase), attempt,
                            step.effect_id, code)

    mark, attempt = step.execution, step.attempts
    rows = []
    if step.state in _FORWARD and step.dispatched_at_ms is not None:
        rows.append(row(step.dispatched_at_ms, Phase.INTENT))
    if step.state in _FORWARD and step.started_at_ms is not None:
        rows.append(row(step.started_at_ms, Phase.EXECUTING))
    if mark is not None and mark.state in _PHASE_OF:
        at = step.committed_at_ms if mark.state is EffectState.COMMITTED else mark.at_ms
        rows.append(row(at or mark.at_ms, _PHASE_OF[mark.state], mark.error_code))
    return rows


def _compensation_events(step: StepRecord) -> list[LifecycleRow]:
    def row(at: int | None, phase: Phase, code: str | None = None) -> LifecycleRow:
        return LifecycleRow(at, step.name, str(Stage.COMPENSATION), str(phase),
                            step.compensation_attempts, step.compensation_effect_id, code)

    mark = step.compensation
    if mark is None or step.state in _FORWARD:
        return []
    rows = [row(step.dispatched_at_ms, Phase.INTENT)]
    if step.started_at_ms is not None and step.state is StepState.COMPENSATING:
        rows.append(row(step.started_at_ms, Phase.EXECUTING))
    if mark.state in _PHASE_OF:
        rows.append(row(mark.at_ms, _PHASE_OF[mark.state], mark.error_code))
    elif step.state is StepState.COMPENSATION_FAILED:
        rows.append(row(mark.at_ms, Phase.FAILED, step.error_code))
    return rows
