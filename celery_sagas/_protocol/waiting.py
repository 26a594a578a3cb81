"""Waiting steps: timers and signal waits (docs/design.md §3.4, §3.5), judged purely.

Each kind judges its own steps (``kinds.StepKind.judge``, in ``kinds.py``); this module is the
question asked of any held step.

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

from .._records import SagaRecord, StepRecord, StepState
from .decisions import Wait, Wake
from .kinds import TIMED_OUT, WakesOn, kind_of, signal_result, timed_out

__all__ = ["TIMED_OUT", "judge_waiting", "signal_name_of", "signal_result", "timed_out"]


def signal_name_of(step: StepRecord) -> str | None:
    """The signal a waiting step waits for, or None when it is no signal wait."""
    kind = kind_of(step)
    return kind.waits_for(step) if kind.wakes_on is WakesOn.SIGNAL else None


def judge_waiting(saga: SagaRecord, step: StepRecord, now_ms: int) -> Wake | Wait:
    """Wake a waiting step (with what it commits), or wait until its wake-up time (None: until
    something is sent to it)."""
    judge = kind_of(step).judge
    if step.state is not StepState.WAITING or judge is None:
        return Wait()
    return judge(saga, step, now_ms) or Wait()
