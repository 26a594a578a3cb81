"""Waiting steps: timers and signal waits (docs/design.md §3.4, §3.5), judged purely.

A ``waiting`` step holds its saga without holding a worker. It commits when what it waits for
has happened, and the replay then reads what it committed with:

- a timer (``ctx.sleep``) commits with None once its ``wake_at_ms`` has passed;
- a signal wait (``ctx.wait_signal``) commits with the first unconsumed signal of its name
  (``{"signal_id": ..., "payload": ...}``), sent before or after the wait began, and marks that
  signal consumed in the same write; once its timeout (``wake_at_ms``) has passed with no such
  signal it commits with the timeout marker ``{"timeout": true}``, which makes the replay raise
  ``SignalTimeout`` at that call.

So a fired timer or a consumed signal returns at once on replay, and the same record always
replays the same way.
"""

from __future__ import annotations

from typing import Any

from .._records import SIGNAL_TASK, TIMER_TASK, SagaRecord, SignalRecord, StepRecord, StepState
from .decisions import Wait, Wake

__all__ = ["TIMED_OUT", "judge_waiting", "signal_name_of", "signal_result", "timed_out"]

TIMED_OUT: dict[str, Any] = {"timeout": True}


def signal_result(signal: SignalRecord) -> dict[str, Any]:
    """What a signal wait commits with when ``signal`` arrives."""
    return {"signal_id": signal.signal_id, "payload": signal.payload}


def timed_out(result: Any) -> bool:
    """Whether a committed signal wait's result is the timeout marker."""
    return isinstance(result, dict) and result.get("timeout") is True


def signal_name_of(step: StepRecord) -> str | None:
    """The signal a waiting step waits for, or None when it is no signal wait."""
    if step.task != SIGNAL_TASK:
        return None
    name = step.kwargs.get("signal")
    return name if isinstance(name, str) else None


def _first_unconsumed(saga: SagaRecord, name: str) -> SignalRecord | None:
    for signal in saga.signals:
        if signal.name == name and signal.consumed_by is None:
            return signal
    return None


def judge_waiting(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wake | Wait:
    """Wake a waiting step (with what it commits), or wait until its wake-up time (None: until
    something is sent to it)."""
    if step.state is not StepState.WAITING:
        return Wait()
    due = step.wake_at_ms is not None and now_ms >= step.wake_at_ms
    if step.task == TIMER_TASK:
        return Wake(step, None) if due else Wait(step.wake_at_ms)
    name = signal_name_of(step)
    if name is None:
        return Wait()
    signal = _first_unconsumed(saga, name)
    if signal is not None:
        return Wake(step, signal_result(signal), signal.signal_id)
    return Wake(step, dict(TIMED_OUT)) if due else Wait(step.wake_at_ms)
