"""The registry of step kinds (docs/design.md §3.11), pure.

A saga's step is of one kind: a plain step (a task a worker runs), an approval gate
(``ctx.approval``), a timer (``ctx.sleep``), a signal wait (``ctx.wait_signal``) or a child
saga (``ctx.child``). Each kind says, in one ``StepKind`` value here, what its step holds (the
task name it is recorded under, what it waits for), how it wakes (a worker's report, a
deadline, a signal, a decision, its child's end), how it is undone (its compensator, nothing,
or the child saga compensating), what its history entries are and how the timeline draws it.
Everyone else asks ``kind_of(step)`` instead of comparing task names, so a new kind is a
``register(StepKind(...))`` plus a ``ctx`` method that records it (``SagaContext.hold``); the
I/O a kind needs on the side (the sweep's repairs) is registered in the engine's ``_repairs``.

A step's kind is the kind registered under its task; a step of no registered task carrying an
approval id is a gate, any other a plain step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .._records import HistoryEntry, HistoryEvent, SagaRecord, SignalRecord, StepRecord, StepState
from .decisions import Wait, Wake

__all__ = [
    "APPROVAL",
    "APPROVAL_TASK",
    "CHILD",
    "CHILD_TASK",
    "CHILD_UNDO",
    "HELD_STATES",
    "PLAIN",
    "SIGNAL",
    "SIGNAL_TASK",
    "TIMED_OUT",
    "TIMER",
    "TIMER_TASK",
    "StepKind",
    "Undo",
    "WakesOn",
    "awaiting_decision",
    "child_id_of",
    "kind_of",
    "kinds",
    "register",
    "signal_result",
    "timed_out",
    "unregister",
]

# The task names recorded for steps no task runs: approval gates, timers, signal waits, children.
APPROVAL_TASK = "celery_sagas.approval"
TIMER_TASK = "celery_sagas.sleep"
SIGNAL_TASK = "celery_sagas.wait_signal"
CHILD_TASK = "celery_sagas.child"
# The compensator recorded for a child step: undo the child saga as a unit (docs/design.md §3.7).
CHILD_UNDO = "celery_sagas.undo_child"

# The states a held step waits in: a gate awaits its decision, any other held step waits.
HELD_STATES = (StepState.WAITING, StepState.AWAITING_APPROVAL)

TIMED_OUT: dict[str, Any] = {"timeout": True}

E = HistoryEvent


class WakesOn(str, Enum):
    """What moves a step on from its intent."""

    WORKER = "worker"  # a plain step: a worker runs its task and reports
    DEADLINE = "deadline"  # a timer: its wake-up time passing
    SIGNAL = "signal"  # a signal wait: a signal of its name, or its timeout
    DECISION = "decision"  # an approval gate: a human's decision (or the approval's expiry)
    CHILD_END = "child-end"  # a child step: its child saga settling


class Undo(str, Enum):
    """How a committed step is undone when its saga rolls back."""

    COMPENSATOR = "compensator"  # its compensator task runs (none declared: nothing to undo)
    NOTHING = "nothing"  # no side effect of its own: nothing to undo
    CHILD_SAGA = "child-saga"  # the child saga is reopened and compensates its own steps


Judge = Callable[[SagaRecord, StepRecord, int], "Wake | Wait | None"]


def _report(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wait:
    """Wait for a report: nothing to judge from the record alone."""
    return Wait()


def _none(step: StepRecord) -> str | None:
    return None


def _kwarg(key: str) -> Callable[[StepRecord], str | None]:
    def read(step: StepRecord) -> str | None:
        value = step.kwargs.get(key) if isinstance(step.kwargs, Mapping) else None
        return value if isinstance(value, str) else None

    return read


def _opened(step: StepRecord, at: int) -> HistoryEntry:
    """A step appended: its intent."""
    state = None if step.state is StepState.EXECUTING else str(step.state)
    return HistoryEntry(at, E.INTENT, step.name, state=state, code=step.error_code)


def _failed(step: StepRecord, at: int) -> HistoryEntry:
    return HistoryEntry(at, E.FAILED, step.name, step.attempts, code=step.error_code)


def _ended(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    """A held step committed or failed."""
    if step.state is StepState.FAILED:
        return _failed(step, at)
    return HistoryEntry(at, E.COMMITTED, step.name, step.attempts)


@dataclass(frozen=True, slots=True)
class StepKind:
    """One kind of step: what it holds, how it wakes, how it is undone, how it is drawn.

    Attributes:
        name: the kind's word, as the timeline's CSS class and the waits list say it.
        task: the task name its steps are recorded under (a plain step: any other).
        wakes_on: what moves it on; anything but ``WORKER`` is held (no task runs it).
        undo: how a committed step of this kind is undone.
        held_state: the state a held step waits in (one of ``HELD_STATES``).
        judge: what the record alone says about a held step now: wake it (``Wake``), wait
            (until a time, or a report), or None (only a call from outside moves it).
        abandoned_on_rollback: whether a saga rolling back abandons a step of this kind
            still held (a child saga is cancelled instead, and settles the step itself).
        exact_replay: whether a replay must ask for it with the recorded arguments (a
            timer's wake-up was fixed when it was recorded).
        compensator: the compensator recorded for it (a plain step: its definition's).
        waits_for: what it waits for (a signal's name, a child saga's id, an approval's).
        opened: its history entry when appended.
        ended: its history entry when it commits or fails.
        caption: what the timeline's tooltip says it does, before its deadline and state.
        deadline: how the timeline's mark at its ``wake_at_ms`` reads ("wakes", "times out").
    """

    name: str
    task: str
    wakes_on: WakesOn
    undo: Undo = Undo.NOTHING
    held_state: StepState = StepState.WAITING
    judge: Judge | None = _report
    abandoned_on_rollback: bool = True
    exact_replay: bool = True
    compensator: str | None = None
    waits_for: Callable[[StepRecord], str | None] = _none
    opened: Callable[[StepRecord, int], HistoryEntry] = _opened
    ended: Callable[[StepRecord, int, SagaRecord], HistoryEntry] = _ended
    caption: Callable[[StepRecord], str] | None = None
    deadline: str = "times out"

    @property
    def held(self) -> bool:
        """True when no task runs the step: it holds its saga until it wakes."""
        return self.wakes_on is not WakesOn.WORKER

    def describe(self, step: StepRecord) -> str:
        """What the step does, for a tooltip (without its deadline and state)."""
        return self.caption(step) if self.caption is not None else self.name


# ---------------------------------------------------------------- timers and signal waits
# (docs/design.md §3.4, §3.5): a timer commits with None once its wake-up time passed; a
# signal wait with the first unconsumed signal of its name, or the timeout marker once its
# timeout passed with none.


def signal_result(signal: SignalRecord) -> dict[str, Any]:
    """What a signal wait commits with when ``signal`` arrives."""
    return {"signal_id": signal.signal_id, "payload": signal.payload}


def timed_out(result: Any) -> bool:
    """Whether a committed signal wait's result is the timeout marker."""
    return isinstance(result, dict) and result.get("timeout") is True


def _due(step: StepRecord, now_ms: int) -> bool:
    return step.wake_at_ms is not None and now_ms >= step.wake_at_ms


def _judge_timer(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wake | Wait:
    return Wake(step, None) if _due(step, now_ms) else Wait(step.wake_at_ms)


def _judge_signal(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wake | Wait:
    name = _signal_name(step)
    if name is None:
        return Wait()
    signal = next((s for s in saga.signals if s.name == name and s.consumed_by is None), None)
    if signal is not None:
        return Wake(step, signal_result(signal), signal.signal_id)
    return Wake(step, dict(TIMED_OUT)) if _due(step, now_ms) else Wait(step.wake_at_ms)


_signal_name = _kwarg("signal")
_child_id = _kwarg("saga_id")


def _timer_ended(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    return _failed(step, at) if step.state is StepState.FAILED else \
        HistoryEntry(at, E.TIMER_FIRED, step.name)


def _signal_opened(step: StepRecord, at: int) -> HistoryEntry:
    return HistoryEntry(at, E.SIGNAL_WAIT, step.name, code=_signal_name(step), due_ms=step.wake_at_ms)


def _signal_ended(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    if step.state is StepState.FAILED:
        return _failed(step, at)
    consumed = next((s for s in saga.signals if s.consumed_by == step.name), None)
    if consumed is None:
        return HistoryEntry(at, E.SIGNAL_TIMED_OUT, step.name)
    return HistoryEntry(at, E.SIGNAL_CONSUMED, step.name, code=consumed.name, ref=consumed.signal_id)


# ---------------------------------------------------------------- approval gates and children


def _approval_ended(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    result = step.result if isinstance(step.result, dict) else {}
    by = result.get("decided_by")
    return HistoryEntry(at, E.APPROVAL_DECIDED, step.name, state=str(step.state),
                        code=step.error_code, ref=step.approval_id,
                        actor=by if isinstance(by, str) else None)


def _child_ended(step: StepRecord, at: int, saga: SagaRecord) -> HistoryEntry:
    return HistoryEntry(at, E.CHILD_ENDED, step.name, state=str(step.state), code=step.error_code,
                        ref=_child_id(step))


PLAIN = StepKind("run", "", WakesOn.WORKER, Undo.COMPENSATOR, StepState.EXECUTING)
APPROVAL = StepKind(
    "approval", APPROVAL_TASK, WakesOn.DECISION, held_state=StepState.AWAITING_APPROVAL,
    judge=None, waits_for=lambda step: step.approval_id,
    opened=lambda step, at: HistoryEntry(at, E.APPROVAL_REQUESTED, step.name, ref=step.approval_id),
    ended=_approval_ended, caption=lambda step: "approval gate")
TIMER = StepKind(
    "timer", TIMER_TASK, WakesOn.DEADLINE, judge=_judge_timer, exact_replay=False,
    opened=lambda step, at: HistoryEntry(at, E.TIMER_SET, step.name, due_ms=step.wake_at_ms),
    ended=_timer_ended, caption=lambda step: "timer", deadline="wakes")
SIGNAL = StepKind(
    "signal", SIGNAL_TASK, WakesOn.SIGNAL, judge=_judge_signal, waits_for=_signal_name,
    opened=_signal_opened, ended=_signal_ended,
    caption=lambda step: f"waiting for signal {step.kwargs.get('signal')}")
CHILD = StepKind(
    "child", CHILD_TASK, WakesOn.CHILD_END, Undo.CHILD_SAGA, abandoned_on_rollback=False,
    compensator=CHILD_UNDO, waits_for=_child_id,
    opened=lambda step, at: HistoryEntry(at, E.CHILD_STARTED, step.name, ref=_child_id(step)),
    ended=_child_ended, caption=lambda step: f"child saga {step.kwargs.get('saga_id')}")

_KINDS: dict[str, StepKind] = {k.task: k for k in (APPROVAL, TIMER, SIGNAL, CHILD)}


def register(kind: StepKind) -> StepKind:
    """Add a held kind to the registry (ValueError when its task has another kind)."""
    if not kind.held or kind.held_state not in HELD_STATES:
        raise ValueError(f"a step kind is held, in one of {[str(s) for s in HELD_STATES]}")
    known = _KINDS.setdefault(kind.task, kind)
    if known != kind:
        raise ValueError(f"task {kind.task!r} is the step kind {known.name!r} already")
    return kind


def unregister(kind: StepKind) -> None:
    """Remove a kind ``register`` added (the built-in kinds stay)."""
    if kind in (APPROVAL, TIMER, SIGNAL, CHILD):
        raise ValueError(f"the built-in step kind {kind.name!r} stays")
    if _KINDS.get(kind.task) == kind:
        del _KINDS[kind.task]


def kinds() -> tuple[StepKind, ...]:
    """Every registered held kind."""
    return tuple(_KINDS.values())


def kind_of(step: StepRecord) -> StepKind:
    """The kind of ``step``: the one registered under its task; else a gate when it carries an
    approval id, else a plain step."""
    kind = _KINDS.get(step.task)
    if kind is not None:
        return kind
    return APPROVAL if step.approval_id is not None else PLAIN


def child_id_of(step: StepRecord) -> str | None:
    """The child saga id a child step names, or None for any other step."""
    kind = kind_of(step)
    return kind.waits_for(step) if kind.wakes_on is WakesOn.CHILD_END else None


def awaiting_decision(step: StepRecord) -> bool:
    """True when ``step`` is an approval gate still waiting for its decision."""
    return step.state is APPROVAL.held_state
