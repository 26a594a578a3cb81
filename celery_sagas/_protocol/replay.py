"""Replay: match the steps ``run`` asks for against the steps already recorded (pure).

``run(ctx, input)`` is called from the top each time a saga advances. The n-th step it asks
for must be the n-th recorded step (same name, task, compensator and arguments); a committed
one returns its stored result, an uncommitted one suspends the replay, and one past the end is
new. Anything else is non-determinism. The outcome of a whole replay is one of the values
below; ``context.py`` produces it by running user code against these rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._records import SagaRecord, StepRecord
from .decisions import Review, StartCompensation
from .kinds import kind_of

__all__ = [
    "Crashed",
    "Diverged",
    "Mismatch",
    "New",
    "Outcome",
    "Recorded",
    "Refused",
    "Returned",
    "StepCall",
    "Suspended",
    "match_call",
    "unreached",
]


@dataclass(frozen=True, slots=True)
class StepCall:
    """One step as ``run`` asks for it during a replay (arguments already JSON-normalised)."""

    name: str
    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    compensator: str | None
    time_limit_ms: int | None = None
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The call matches a recorded step."""

    step: StepRecord


@dataclass(frozen=True, slots=True)
class New:
    """The call is past the recorded steps."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The call disagrees with the recorded step at its position."""

    reason: str


def match_call(saga: SagaRecord, position: int, call: StepCall) -> Recorded | New | Mismatch:
    """Match the call made at ``position`` against the record."""
    if position >= len(saga.steps):
        return New()
    step = saga.steps[position]
    if step.name != call.name or step.task != call.task:
        return Mismatch(
            f"step {position + 1} was recorded as {step.name!r} but run() now asks for {call.name!r}"
        )
    if step.compensator != call.compensator:
        return Mismatch(f"step {step.name!r} no longer has compensator {step.compensator!r}")
    if not kind_of(step).exact_replay:
        # A timer's wake-up was fixed when it was recorded; sleep_until(now + x) need not
        # repeat it to the millisecond (docs/design.md §3.4).
        return Recorded(step)
    if list(step.args) != list(call.args) or dict(step.kwargs) != dict(call.kwargs):
        return Mismatch(f"step {step.name!r} is asked for with other arguments than recorded")
    if step.group != call.group:
        return Mismatch(f"step {step.name!r} changed its parallel group")
    return Recorded(step)


def unreached(saga: SagaRecord, calls: int) -> Diverged | None:
    """Recorded steps that a finished run() no longer asked for are non-determinism."""
    if calls < len(saga.steps):
        return Diverged(f"run() returned before recorded step {saga.steps[calls].name!r}")
    return None


@dataclass(frozen=True, slots=True)
class Returned:
    """run() returned: every step it asked for is committed; ``patches`` are the
    ``ctx.patched`` ids it passed that the record does not hold yet."""

    value: Any = None
    patches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Suspended:
    """run() stopped at uncommitted steps; ``new_steps`` are to be recorded and dispatched
    (with the new ``patches`` passed before them)."""

    new_steps: tuple[StepRecord, ...] = ()
    patches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Diverged:
    """run() asked for something other than what is recorded."""

    reason: str


# run() itself raised or misused the context: a bug, already the decision to send the saga to
# manual review (``exception``: the type and message of what run() raised, if it raised;
# ``traceback``: where, as ``_values.traceback_text`` summarises it).
Crashed = Review

# run() raised StepNotCommitted: the outcome is already the decision to roll back what was done.
Refused = StartCompensation

Outcome = Returned | Suspended | Diverged | Crashed | Refused
